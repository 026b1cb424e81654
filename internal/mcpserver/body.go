package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// bufferBody reads a POST's body, at most MaxRequestBytes, and puts it
// back for the transport. It answers a body over the limit itself, and
// reports whether the request goes on: the SDK answers one with a plain
// text 413, which a client cannot match to its call and which its SDK
// takes as a broken connection; this answer is the JSON-RPC error of the
// call (with its id, when the part read names it), as the transport
// answers the other requests it refuses.
func (h *Handler) bufferBody(w http.ResponseWriter, r *http.Request) bool {
	limit := h.opts.MaxRequestBytes
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeRPCError(w, http.StatusRequestEntityTooLarge, leadingID(data), fmt.Sprintf("request body exceeds %d bytes", limit))
		return false
	case err != nil:
		// The client went away or stalled; whoever is still there is told.
		writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, "failed to read the request body")
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	return true
}

// writeRPCError answers a JSON-RPC error response (Invalid Request) with
// the HTTP status; a zero id is left out, as the transport leaves it out
// when it could not read the request.
func writeRPCError(w http.ResponseWriter, status int, id jsonrpc.ID, msg string) {
	data, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: msg}})
	if err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// leadingID is the id of the JSON-RPC message that data starts, when it
// comes before anything the cut-off data cannot finish (clients write it
// before the params); else the zero ID. A batch has no one id.
func leadingID(data []byte) jsonrpc.ID {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return jsonrpc.ID{}
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return jsonrpc.ID{}
		}
		var value any
		if key != "id" {
			// Skip the member; a value cut off by the limit ends the search.
			if err := dec.Decode(&json.RawMessage{}); err != nil {
				return jsonrpc.ID{}
			}
			continue
		}
		if err := dec.Decode(&value); err != nil {
			return jsonrpc.ID{}
		}
		id, err := jsonrpc.MakeID(value)
		if err != nil {
			return jsonrpc.ID{}
		}
		return id
	}
	return jsonrpc.ID{}
}
