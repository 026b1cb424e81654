package codeint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Paths of the interpreter's API, relative to where the agent mounts it
// (guest.CodePath): E2B's code-interpreter server's.
const (
	PathHealth   = "/health"
	PathExecute  = "/execute"
	PathContexts = "/contexts"
	// PathWarm (sandboxd's, the host's alone) starts the caller's default
	// context of {"language"} now, so that the first execution finds its
	// kernel started (or starting: it waits for that one).
	PathWarm = "/warm"
)

// maxRequest bounds a request body (the code of a cell, with its
// variables).
const maxRequest = 16 << 20

// ExecuteRequest is the body of POST /execute: E2B's, plus TimeoutMs,
// sandboxd's (E2B's SDKs time out on their side).
type ExecuteRequest struct {
	Code      *string           `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
	// TimeoutMs interrupts the cell after this long (0: no limit); the
	// context keeps its state.
	TimeoutMs int64 `json:"timeout_ms"`
}

// CreateContextRequest is the body of POST /contexts.
type CreateContextRequest struct {
	Language *string `json:"language"`
	Cwd      *string `json:"cwd"`
}

// ServeHTTP serves the API for c; r's path is relative to the mount.
func (in *Interpreter) ServeHTTP(w http.ResponseWriter, r *http.Request, c Caller) {
	path := r.URL.Path
	switch {
	case path == PathHealth && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, "OK")
	case path == PathExecute && r.Method == http.MethodPost:
		in.serveExecute(w, r, c)
	case path == PathContexts && r.Method == http.MethodPost:
		var req CreateContextRequest
		if !decode(w, r, &req) {
			return
		}
		cx, err := in.Create(r.Context(), c, deref(req.Language), deref(req.Cwd))
		if err != nil {
			writeErr(w, err, "Failed to create context: ")
			return
		}
		writeJSON(w, http.StatusOK, cx)
	case path == PathWarm && r.Method == http.MethodPost:
		var req CreateContextRequest
		if !decode(w, r, &req) {
			return
		}
		if _, err := in.Default(r.Context(), c, deref(req.Language)); err != nil {
			writeErr(w, err, "Failed to create context: ")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case path == PathContexts && r.Method == http.MethodGet:
		cs := in.List(c)
		if cs == nil {
			cs = []*Context{}
		}
		writeJSON(w, http.StatusOK, cs)
	case strings.HasPrefix(path, PathContexts+"/"):
		rest := strings.TrimPrefix(path, PathContexts+"/")
		id, action, _ := strings.Cut(rest, "/")
		var err error
		switch {
		case action == "restart" && r.Method == http.MethodPost:
			err = in.Restart(c, id)
		case action == "" && r.Method == http.MethodDelete:
			err = in.Remove(c, id)
		default:
			http.Error(w, "no such route: "+r.Method+" "+path, http.StatusNotFound)
			return
		}
		if err != nil {
			writeErr(w, err, "")
			return
		}
		writeJSON(w, http.StatusOK, nil)
	default:
		http.Error(w, "no such route: "+r.Method+" "+path, http.StatusNotFound)
	}
}

func (in *Interpreter) serveExecute(w http.ResponseWriter, r *http.Request, c Caller) {
	var req ExecuteRequest
	if !decode(w, r, &req) {
		return
	}
	switch {
	case req.Code == nil:
		http.Error(w, "code: required (the code to run)", http.StatusBadRequest)
		return
	case req.ContextID != nil && req.Language != nil:
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	case req.TimeoutMs < 0:
		http.Error(w, "timeout_ms: not negative", http.StatusBadRequest)
		return
	}
	for k := range req.EnvVars {
		if !validEnvName(k) {
			http.Error(w, fmt.Sprintf("env_vars: %q is not a variable name (letters, digits and _, not starting with a digit)", k), http.StatusBadRequest)
			return
		}
	}
	var (
		cx  *Context
		err error
	)
	if req.ContextID != nil {
		cx, err = in.Get(c, *req.ContextID)
	} else {
		cx, err = in.Default(r.Context(), c, deref(req.Language))
	}
	if err != nil {
		writeErr(w, err, "")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	x := execution{cx: cx, code: *req.Code, env: req.EnvVars, timeout: time.Duration(req.TimeoutMs) * time.Millisecond,
		write: func(v any) error {
			if err := enc.Encode(v); err != nil {
				return err
			}
			return rc.Flush()
		}}
	x.run(r.Context())
}

func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, ch := range k {
		switch {
		case ch == '_', ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z':
		case ch >= '0' && ch <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequest))
	if err != nil {
		http.Error(w, fmt.Sprintf("read the body: %v (at most %d MiB)", err, maxRequest>>20), http.StatusRequestEntityTooLarge)
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, v); err != nil {
		http.Error(w, "the body is not the JSON object expected: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// writeErr answers err as E2B's server does, in plain text: 404 for a
// context that is not there, 400 for a request that cannot be served
// here, 500 (after prefix) for a kernel that failed.
func writeErr(w http.ResponseWriter, err error, prefix string) {
	msg := err.Error()
	switch {
	case errors.Is(err, errNotFound):
		http.Error(w, strings.TrimPrefix(msg, errNotFound.Error()+": "), http.StatusNotFound)
	case errors.Is(err, errInvalid):
		http.Error(w, strings.TrimPrefix(msg, errInvalid.Error()+": "), http.StatusBadRequest)
	default:
		http.Error(w, prefix+msg, http.StatusInternalServerError)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
