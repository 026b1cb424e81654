package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// E2B's volumes (the SDK's Volume.create, list, getInfo, connect, destroy,
// and Sandbox.create's volumeMounts) are sandboxd's volumes (package
// volumes): an account's named ext4 images, mounted read-write into the
// sandboxes created with them. A volume's volumeID is sandboxd's id
// (vol_...); its size is sandboxd's default, as E2B's NewVolume has none.
//
// E2B also serves a volume's files through a content API of its own
// (/volumecontent/..., at api.DOMAIN, with the volume's token): sandboxd
// does not. A volume's files are reached through a sandbox that mounts
// it. What a volume answers for that API's token and domain sends the
// SDK's content calls nowhere they could be served or leak (volumeContent).

// Volumes is what the volume routes do (package volumes' Service), for the
// acting account.
type Volumes interface {
	Create(ctx context.Context, account, name string, sizeBytes int64) (volumes.Info, error)
	List(ctx context.Context, account string) ([]volumes.Info, error)
	Get(ctx context.Context, account, ref string) (volumes.Info, error)
	Delete(ctx context.Context, account, ref string) (volumes.Info, error)
}

// volumeContentToken is every volume's token: E2B's VolumeAndToken needs
// one (the SDKs send it to the content API), and sandboxd serves no
// content API, so it is a fixed word that grants nothing, not a secret.
const volumeContentToken = "sandboxd-volume-content-not-served"

// unservedDomain is the domain a volume answers when the server has no
// E2B domain: the SDK sends content calls to api.DOMAIN, and .invalid
// never resolves (RFC 6761), so they fail on the caller's machine instead
// of going to E2B's cloud (the SDK's default domain) with the caller's
// files.
const unservedDomain = "volume-content-not-served.sandboxd.invalid"

// volumeInfo is E2B's Volume (a list's entries).
type volumeInfo struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// volumeAndToken is E2B's VolumeAndToken (create's and get's answer).
type volumeAndToken struct {
	volumeInfo
	Token  string `json:"token"`
	Domain string `json:"domain"`
}

func (a *API) volumeAndToken(v store.Volume) volumeAndToken {
	d := a.opts.Domain
	if d == "" {
		d = unservedDomain
	}
	return volumeAndToken{volumeInfo: volumeInfo{VolumeID: v.ID, Name: v.Name}, Token: volumeContentToken, Domain: d}
}

// volumesOf is the server's volumes, or the answer of a server without.
func (a *API) volumesOf() (Volumes, error) {
	if a.opts.Volumes == nil {
		return nil, edge.Errorf(http.StatusNotFound, "this server has no volumes")
	}
	return a.opts.Volumes, nil
}

// createVolume is POST /volumes {name} (Volume.create): 201 with the new
// volume, of the default size; a name the account has is 409.
func (a *API) createVolume(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req struct {
		Name *string `json:"name"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == nil || *req.Name == "" {
		return edge.Errorf(http.StatusBadRequest, "name: required")
	}
	vols, err := a.volumesOf()
	if err != nil {
		return err
	}
	v, err := vols.Create(r.Context(), c.AccountID, *req.Name, 0)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, a.volumeAndToken(v.Volume))
	return nil
}

// listVolumes is GET /volumes (Volume.list): the account's volumes by
// name.
func (a *API) listVolumes(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	out := []volumeInfo{}
	if a.opts.Volumes != nil {
		list, err := a.opts.Volumes.List(r.Context(), c.AccountID)
		if err != nil {
			return err
		}
		for _, v := range list {
			out = append(out, volumeInfo{VolumeID: v.ID, Name: v.Name})
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getVolume is GET /volumes/{volumeID} (Volume.getInfo, connect): the
// account's volume by its id (or its name); another account's is 404.
func (a *API) getVolume(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	vols, err := a.volumesOf()
	if err != nil {
		return err
	}
	v, err := vols.Get(r.Context(), c.AccountID, pathParam(r, "volumeID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.volumeAndToken(v.Volume))
	return nil
}

// deleteVolume is DELETE /volumes/{volumeID} (Volume.destroy): the volume
// and its data; 204, 404 when there is none (destroy answers false), 409
// while a sandbox has it mounted.
func (a *API) deleteVolume(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	vols, err := a.volumesOf()
	if err != nil {
		return err
	}
	if _, err := vols.Delete(r.Context(), c.AccountID, pathParam(r, "volumeID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// volumeContent answers every call of E2B's volume content API (the SDK's
// Volume#list, readFile, writeFile, makeDir, getInfo, exists,
// updateMetadata, remove), should one reach sandboxd (at api.DOMAIN, or
// E2B_VOLUME_API_URL pointed here): 501, which the SDK raises as a
// VolumeError with this message; never 404, which it would read as a path
// not found. It needs no key: it serves nothing.
func (a *API) volumeContent(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusNotImplemented, envd.Error{Code: http.StatusNotImplemented, Message: "E2B's volume content API is not served by sandboxd: a volume's files are reached through a sandbox that mounts it (Sandbox.create with volumeMounts, then its files and commands)"})
}

// volumeMount is E2B's SandboxVolumeMount: the volume's name at a path.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// parseVolumeMounts reads create's volumeMounts (E2B's
// SandboxVolumeMount[]; the SDK sends its map of path to volume so) as the
// manager's mounts, read-write (E2B's have no read-only flag). A
// malformed entry is 400 naming it; a key E2B's mounts do not have is
// refused, never ignored. The manager checks the rest (the volume is the
// account's, the path allowed, no volume or path twice).
func parseVolumeMounts(raw json.RawMessage) ([]volumes.Mount, error) {
	if !asks(raw) {
		return nil, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, edge.Errorf(http.StatusBadRequest, "volumeMounts: want a list of {name, path}")
	}
	out := make([]volumes.Mount, 0, len(entries))
	for i, e := range entries {
		field := fmt.Sprintf("volumeMounts[%d]", i)
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(e, &keys); err != nil || keys == nil {
			return nil, edge.Errorf(http.StatusBadRequest, "%s: want {name, path}", field)
		}
		var extra []string
		for k := range keys {
			if k != "name" && k != "path" {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			slices.Sort(extra)
			return nil, edge.Errorf(http.StatusBadRequest, "%s: %s: not supported by sandboxd (a mount is {name, path}, read-write)", field, strings.Join(extra, ", "))
		}
		var m volumeMount
		dec := json.NewDecoder(bytes.NewReader(e))
		if err := dec.Decode(&m); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return nil, edge.Errorf(http.StatusBadRequest, "%s.%s: want a string", field, te.Field)
			}
			return nil, edge.Errorf(http.StatusBadRequest, "%s: want {name, path}", field)
		}
		if strings.TrimSpace(m.Name) == "" {
			return nil, edge.Errorf(http.StatusBadRequest, "%s.name: required (the volume's name)", field)
		}
		if m.Path == "" {
			return nil, edge.Errorf(http.StatusBadRequest, "%s.path: required (where the volume is mounted, an absolute path)", field)
		}
		out = append(out, volumes.Mount{Name: m.Name, Path: m.Path})
	}
	return out, nil
}

// sandboxVolumeMounts is what sandbox id mounts, in E2B's terms (getInfo's
// volumeMounts): each volume's name at its path, in mount order.
func (a *API) sandboxVolumeMounts(ctx context.Context, id string) ([]volumeMount, error) {
	out := []volumeMount{}
	atts, err := a.opts.Store.SandboxVolumes(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, att := range atts {
		name := att.VolumeID
		if v, err := a.opts.Store.GetVolume(ctx, att.VolumeID); err == nil {
			name = v.Name
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		out = append(out, volumeMount{Name: name, Path: att.Path})
	}
	return out, nil
}
