// Package usererr marks the part of an error that may be shown to the user
// of a run or a request. Everything else in an error (host paths, database
// errors, the text of a wrapped system error) stays in the server's log.
//
// A component that refuses something for a reason the user can act on
// (a quota, a limit, a missing tool) returns New or Wrap; the code that
// reports the failure asks Message for the user's text and logs the rest.
package usererr

import (
	"errors"
	"strings"
)

// Error carries a message meant for the user, and the error it explains.
type Error struct {
	Msg string // shown to the user: no host paths, no internals
	Err error  // the cause, for logs; may be nil
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	return e.Msg + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// New is an error whose whole text is for the user.
func New(msg string) error { return &Error{Msg: msg} }

// Wrap explains err to the user with msg; err's own text stays in logs.
func Wrap(err error, msg string) error { return &Error{Msg: msg, Err: err} }

// Message returns err's text down to the outermost user message in its
// chain — the context the wrapping code added ("clone REPO: ") and the user
// message, without the cause below it — or fallback when the chain has no
// user message. Wrapping code adds context, never host paths.
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
