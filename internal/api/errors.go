package api

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// Error is an error the API reports to the caller as is: a status code and
// the body of the contract (edge.Error). Anything else that reaches
// writeError is told as edge.Explain tells it.
type Error = edge.Error

var (
	errNotAvailable = &Error{Status: http.StatusNotImplemented, Msg: "not available yet"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// explain is err as the caller is told it (edge.Explain, with notFound
// naming what a bare not-found was), or err itself when it is internal,
// for writeError to log.
func explain(err error, notFound string) error {
	if e, internal := edge.Explain(err, notFound); !internal {
		return e
	}
	return err
}

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
		log.ErrorContext(r.Context(), "request failed", "err", err, "request_id", requestID(r.Context()), "path", r.URL.Path)
	}
	body := contract.ErrorBody{Status: "error", Error: e.Msg, MissingFields: e.Fields}
	if e.Echo {
		body.Message = e.Msg
	}
	writeJSON(w, e.Status, body)
}
