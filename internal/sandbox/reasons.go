package sandbox

import (
	"context"
	"errors"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// A failed sandbox says why to its user (the API's failureReason): a short
// phrase that completes "the sandbox failed: ...", in words the user can
// act on. It never holds a host path, a stack trace or an internal error's
// text: the error that explains it goes to the server's log, and the
// runtime's errors (which name state directories and runsc's log files)
// are mapped to one of these.
const (
	// reasonStartGeneric: the runtime failed in a way that has no
	// meaning for the user; the log has it.
	reasonStartGeneric = "the sandbox runtime could not start it (the server's log has the details)"
	reasonNoDisk       = "its node ran out of disk space while starting it; try again later"
	reasonNoMemory     = "its node ran out of memory while starting it; try again later"
	reasonStartTimeout = "it did not start in time (its node may be overloaded); try again"
	reasonStateChanged = "its state changed while it was starting"
	reasonExited       = "the sandbox process exited unexpectedly"
)

// startFailure is the reason a sandbox the runtime could not start (or
// fork) failed, from the runtime's error: a cause the user can do
// something about when one is recognised (the node's disk or memory, a
// start that took too long, a refusal that carries a user message),
// otherwise fallback.
func startFailure(err error, fallback string) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return reasonNoDisk
	case errors.Is(err, syscall.ENOMEM):
		return reasonNoMemory
	case errors.Is(err, context.DeadlineExceeded):
		return reasonStartTimeout
	}
	var e *errdefs.Error
	if errors.As(err, &e) && e.Msg != "" {
		// Written for the user by the code that refused.
		return e.Msg
	}
	return fallback
}
