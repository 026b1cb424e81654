// Package errdefs is how the domain says what kind of failure happened and
// what its user may be told, without knowing how it reaches that user: the
// HTTP API maps the classes to status codes and the contract's bodies, the
// MCP server to tool errors, a run to its error message — each in one place
// at its edge (containerd's errdefs, translated by errhttp and errgrpc).
//
// An error carries a class (one of the Err values, or none), a message meant
// for the user — no host paths, no internals — and, for the log only, the
// cause it explains:
//
//	return errdefs.Newf(errdefs.ErrQuota, "account has %d active sandboxes, the limit is %d", n, max)
//	return errdefs.Wrap(errdefs.ErrInvalid, err, "the snapshot is not a valid layer")
//
// Code on the way up adds context with fmt.Errorf("field: %w", err); Message
// returns that context and the user message, never the cause.
package errdefs

import (
	"errors"
	"fmt"
	"strings"
)

// The classes. Test with errors.Is; the edge decides what each one means to
// its caller (the API's status code is in parentheses).
var (
	// ErrNotFound: the thing does not exist, or is not the caller's (404).
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is well-formed but cannot be done (400).
	ErrInvalid = errors.New("invalid request")
	// ErrQuota: over an account's or the node's quota (429).
	ErrQuota = errors.New("over quota")
	// ErrTooLarge: the thing is larger than the server sends or takes (413).
	ErrTooLarge = errors.New("too large")
	// ErrForbidden: the caller may see the thing but not do this to it (403).
	ErrForbidden = errors.New("forbidden")
	// ErrNotRunning: the sandbox is not running (409).
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrConflict: the thing's state does not allow this now (409): a
	// template that live sandboxes started from, one still building.
	ErrConflict = errors.New("conflict")
	// ErrNoRepository: the account has no repository yet (404).
	ErrNoRepository = errors.New("no repository")
)

// Error is a failure with a message for its user.
type Error struct {
	Class error  // one of the Err values; nil: a user message without a class
	Msg   string // shown to the user
	Err   error  // the cause, for logs; may be nil
}

// Error is the user message and, after it, the cause (for logs).
func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	return e.Msg + ": " + e.Err.Error()
}

// Unwrap gives errors.Is and errors.As both the class and the cause.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 2)
	if e.Class != nil {
		out = append(out, e.Class)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// New is an error of class whose whole text is for the user.
func New(class error, msg string) error { return &Error{Class: class, Msg: msg} }

// Newf is New with a format.
func Newf(class error, format string, a ...any) error {
	return &Error{Class: class, Msg: fmt.Sprintf(format, a...)}
}

// Wrap explains err to the user with msg, in class; err's own text stays
// in logs.
func Wrap(class, err error, msg string) error { return &Error{Class: class, Msg: msg, Err: err} }

// Message returns err's text down to the outermost user message in its
// chain — the context wrapping code added ("repo_url: ") and the user
// message, without the cause below it — or fallback when the chain has no
// user message.
func Message(err error, fallback string) string {
	var e *Error
	if !errors.As(err, &e) {
		return fallback
	}
	if e.Err == nil {
		return err.Error()
	}
	if msg, ok := strings.CutSuffix(err.Error(), ": "+e.Err.Error()); ok {
		return msg
	}
	return e.Msg
}
