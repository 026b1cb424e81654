package api

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// The volumes (contract.Volume): an account's named persistent volumes,
// kept by the volumes service (internal/volumes) and mounted into
// sandboxes at create (POST /api/sandboxes' volumes). Every node serves
// these routes: a volume is a row and a disk image that follows the
// sandboxes it is attached to.

// volumeRef is the path's {name}: a volume's name or id.
func volumeRef(r *http.Request) string {
	return edge.Unescaped(chi.URLParam(r, "name"))
}

// volumeAccount is the account the query's account_id (or the key) acts
// for, on a server with volumes.
func (s *Server) volumeAccount(r *http.Request) (string, error) {
	requested, err := contract.QueryAccountID(r.URL.Query())
	if err != nil {
		return "", err
	}
	account, err := s.actFor(r, requested)
	if err != nil {
		return "", err
	}
	if s.opts.Volumes == nil {
		return "", errNotAvailable
	}
	return account, nil
}

// createVolume is POST /api/volumes.
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseCreateVolume)
	if err != nil {
		return err
	}
	if s.opts.Volumes == nil {
		return errNotAvailable
	}
	v, err := s.opts.Volumes.Create(r.Context(), account, req.Name, req.SizeBytes())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
	return nil
}

// listVolumes is GET /api/volumes: the account's volumes by name.
func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	account, err := s.volumeAccount(r)
	if err != nil {
		return err
	}
	vs, err := s.opts.Volumes.List(r.Context(), account)
	if err != nil {
		return err
	}
	resp := contract.VolumesResponse{Status: "success", Volumes: make([]contract.Volume, 0, len(vs))}
	for _, v := range vs {
		resp.Volumes = append(resp.Volumes, contract.VolumeView(v))
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// getVolume is GET /api/volumes/{name}.
func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	account, err := s.volumeAccount(r)
	if err != nil {
		return err
	}
	v, err := s.opts.Volumes.Get(r.Context(), account, volumeRef(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
	return nil
}

// deleteVolume is DELETE /api/volumes/{name}: answers the volume as it
// was.
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	account, err := s.volumeAccount(r)
	if err != nil {
		return err
	}
	v, err := s.opts.Volumes.Delete(r.Context(), account, volumeRef(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
	return nil
}

// resizeVolume is PATCH /api/volumes/{name}: a volume only grows.
func (s *Server) resizeVolume(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseResizeVolume)
	if err != nil {
		return err
	}
	if s.opts.Volumes == nil {
		return errNotAvailable
	}
	v, err := s.opts.Volumes.Resize(r.Context(), account, volumeRef(r), req.SizeBytes())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
	return nil
}

// forkVolume is POST /api/volumes/{name}/fork: a new volume of the
// account with the volume's data as it is now.
func (s *Server) forkVolume(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseForkVolume)
	if err != nil {
		return err
	}
	if s.opts.Volumes == nil {
		return errNotAvailable
	}
	v, err := s.opts.Volumes.Fork(r.Context(), account, volumeRef(r), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
	return nil
}
