package api

import (
	"log/slog"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// errNotAvailable answers a route whose service this server lacks, once
// the request is validated and authenticated.
var errNotAvailable = &edge.Error{Status: http.StatusNotImplemented, Msg: "not available yet"}

func writeJSON(w http.ResponseWriter, status int, v any) { contract.WriteJSON(w, status, v) }

// writeError answers with err's contract body as edge.Explain tells it; an
// internal error is logged with the request id and answered a bare 500. A
// request whose body a deadline cut off is answered 408.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	if cut := bodyTimeout(r); cut != nil {
		// Whatever the handler made of the body it did not get whole.
		err = cut
	}
	e, internal := edge.Explain(err, "")
	if internal {
		log.ErrorContext(r.Context(), "request failed", "err", err, "request_id", edge.RequestID(r.Context()), "path", r.URL.Path)
	}
	contract.WriteError(w, e)
}
