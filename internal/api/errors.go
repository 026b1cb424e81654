package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// Error is an error the API reports to the caller as is: a status code and
// the body of the contract. Anything else that reaches writeError is a 500
// whose message leaks nothing.
type Error struct {
	Status int
	Msg    string
	// Fields is the path of the first failing body field (missing_fields).
	Fields []any
	// Message duplicates Msg in a "message" field, as the original API's
	// 401 body did.
	Message bool
}

func (e *Error) Error() string { return e.Msg }

func errBadRequest(msg string) *Error { return &Error{Status: http.StatusBadRequest, Msg: msg} }

func errField(msg string, path ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Msg: msg, Fields: path}
}

func errNotFound(msg string) *Error { return &Error{Status: http.StatusNotFound, Msg: msg} }

var (
	errNotAvailable = &Error{Status: http.StatusNotImplemented, Msg: "not available yet"}
	errMalformed    = errBadRequest("Request body must be valid JSON")
)

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Status        string `json:"status" jsonschema:"enum=error"`
	Error         string `json:"error"`
	Message       string `json:"message,omitempty"`
	MissingFields []any  `json:"missing_fields,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// writeError answers with err's contract body, or a bare 500 for errors the
// API does not know, which are logged with the request id instead. A
// request whose body a deadline cut off is answered 408.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var e *Error
	if cut := bodyTimeout(r); cut != nil {
		// Whatever the handler made of the body it did not get whole.
		err = cut
	}
	if !errors.As(err, &e) {
		log.ErrorContext(r.Context(), "request failed", "err", err, "request_id", requestID(r.Context()), "path", r.URL.Path)
		e = &Error{Status: http.StatusInternalServerError, Msg: "Internal server error"}
	}
	body := ErrorBody{Status: "error", Error: e.Msg, MissingFields: e.Fields}
	if e.Message {
		body.Message = e.Msg
	}
	writeJSON(w, e.Status, body)
}
