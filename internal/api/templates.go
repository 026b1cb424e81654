package api

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// The template routes: a build, the list, one template, its deletion.
// Templates are the caller's account's (or public); the service applies
// the one access rule (another account's is not found).

func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) error {
	req, _, err := bindBody(s, w, r, contract.ParseBuildTemplate)
	if err != nil {
		return err
	}
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	t, err := s.opts.Templates.Build(r.Context(), caller(r).Principal, req.Domain())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, false)})
	return nil
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	list, err := s.opts.Templates.List(r.Context(), caller(r).Principal)
	if err != nil {
		return err
	}
	resp := contract.TemplatesResponse{Status: "success", Templates: make([]contract.Template, 0, len(list))}
	for _, t := range list {
		if !t.IsSnapshot() { // GET /api/snapshots lists them
			resp.Templates = append(resp.Templates, contract.TemplateView(t, false))
		}
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	t, err := s.opts.Templates.Get(r.Context(), caller(r).Principal, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, true)})
	return nil
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	p := caller(r).Principal
	id := chi.URLParam(r, "id")
	t, err := s.opts.Templates.Get(r.Context(), p, id)
	if err != nil {
		return err
	}
	if err := s.opts.Templates.Delete(r.Context(), p, id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, false)})
	return nil
}

// putTemplateFiles is PUT /api/templates/files/{hash}: the body, a tar
// archive (or a gzipped one), stored as the account's build files named
// hash.
func (s *Server) putTemplateFiles(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	hash := chi.URLParam(r, "hash")
	if r.ContentLength > s.opts.Templates.MaxUploadBytes() {
		return &edge.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("The archive is larger than %d bytes, the most one upload may weigh", s.opts.Templates.MaxUploadBytes())}
	}
	info, err := s.opts.Templates.PutFiles(r.Context(), caller(r).Principal, hash, r.Body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.TemplateFilesResponse{Status: "success", Hash: hash, Present: true, Size: info.Size, Entries: info.Entries, Bytes: info.Bytes})
	return nil
}

// getTemplateFiles is GET /api/templates/files/{hash}: whether the
// account has build files named hash (present false when not: the
// question is answered, not a 404).
func (s *Server) getTemplateFiles(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	hash := chi.URLParam(r, "hash")
	info, ok, err := s.opts.Templates.HasFiles(r.Context(), caller(r).Principal, hash)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.TemplateFilesResponse{Status: "success", Hash: hash, Present: ok, Size: info.Size})
	return nil
}

// saveTemplate is POST /api/sandboxes/{id}/template: a running sandbox's
// files as a template. The sandbox is the caller's (the one rule, and the
// request is served on the node that hosts it).
func (s *Server) saveTemplate(w http.ResponseWriter, r *http.Request) error {
	req, sb, err := bindSandbox(s, w, r, contract.ParseSaveTemplate)
	if err != nil {
		return err
	}
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	t, err := s.opts.Templates.FromSandbox(r.Context(), principal(r), sb.ID, req.Name)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, true)})
	return nil
}
