package api

import (
	"net/http"
)

// deleteSandbox serves DELETE /api/sandboxes/{id} (sandboxd): an ended
// sandbox goes now rather than at retention's sweep, and is answered as
// it was.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	_, sb, err := bindSandbox(s, w, r, parseAccountOnly)
	if err != nil {
		return err
	}
	if err := s.opts.Sandboxes.Delete(r.Context(), principal(r), sb.ID); err != nil {
		return serviceError(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, SandboxResponse{Status: "success", Sandbox: s.sandboxView(r.Context(), sb)})
	return nil
}
