package contract

import (
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// The contract's errors: a request's own mistakes, each with its status
// and the contract's exact message (edge.Error, which edge.Explain tells as
// it is).

// BadRequest is a 400 with msg.
func BadRequest(msg string) *edge.Error { return &edge.Error{Status: http.StatusBadRequest, Msg: msg} }

// FieldError is a 400 with msg for the body field at path
// (missing_fields).
func FieldError(msg string, path ...any) *edge.Error {
	return &edge.Error{Status: http.StatusBadRequest, Msg: msg, Fields: path}
}

// NotFound is a 404 with msg.
func NotFound(msg string) *edge.Error { return &edge.Error{Status: http.StatusNotFound, Msg: msg} }

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Status        string `json:"status" jsonschema:"enum=error"`
	Error         string `json:"error"`
	Message       string `json:"message,omitempty"`
	MissingFields []any  `json:"missing_fields,omitempty"`
}

// ErrMalformed is the answer to a body that is not JSON.
var ErrMalformed = BadRequest("Request body must be valid JSON")

// WriteError answers e with the contract's error body.
func WriteError(w http.ResponseWriter, e *edge.Error) {
	body := ErrorBody{Status: "error", Error: e.Msg, MissingFields: e.Fields}
	if e.Echo {
		body.Message = e.Msg
	}
	WriteJSON(w, e.Status, body)
}

// WriteJSON answers v as JSON with status, as the contract writes it (no
// HTML escaping).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
