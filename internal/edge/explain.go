package edge

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Error is a failure a front end tells its caller as it is: a status and a
// message (a request's own mistake, found while reading it).
type Error struct {
	Status int
	Msg    string
	// Fields is the path of the first failing field of a request body.
	Fields []any
	// Echo repeats Msg in a "message" field where the front end's body
	// has one (the original API's 401).
	Echo bool
}

func (e *Error) Error() string { return e.Msg }

// Errorf is an Error with a formatted message.
func Errorf(status int, format string, a ...any) *Error {
	return &Error{Status: status, Msg: fmt.Sprintf(format, a...)}
}

// ErrUnsignedForward is the refusal of a request on the cluster listener
// without another node's valid signature.
var ErrUnsignedForward = &Error{Status: http.StatusUnauthorized, Echo: true,
	Msg: "The cluster listener serves only requests forwarded by another node of the cluster (signed); call the node's API address instead"}

// InternalMessage is what a caller is told of a failure it cannot act on;
// the front end logs the error itself.
const InternalMessage = "Internal server error"

// class is one row of the table: errors of class are answered status,
// with the error's own user message (errdefs.Message) or fallback.
type class struct {
	err      error
	status   int
	fallback string
	// echo: see Error.Echo.
	echo bool
	// fixed: the message is always fallback (auth's errors carry no user
	// message of their own).
	fixed bool
	// named: the front end's name for what was not found (Explain's
	// notFound) replaces fallback.
	named bool
	// fields: see Error.Fields.
	fields []any
}

// classes is the one table from error classes to what a caller is told.
// Order matters where an error is of two classes: the first row wins.
var classes = []class{
	{err: auth.ErrCredentials, status: http.StatusUnauthorized, fallback: "Exactly one of x-api-key or Authorization must be provided", fixed: true},
	{err: auth.ErrUnauthorized, status: http.StatusUnauthorized, fallback: "Unauthorized", echo: true, fixed: true},
	{err: auth.ErrInvalidAccountID, status: http.StatusBadRequest, fallback: "account_id must be a valid UUID", fixed: true, fields: []any{"account_id"}},
	{err: auth.ErrForbidden, status: http.StatusForbidden, fallback: "Access denied to specified account_id", fixed: true},
	{err: auth.ErrScope, status: http.StatusForbidden, fallback: "This key belongs to a sandbox and may only read (GET) the API, use the git server and the model proxy"},
	{err: errdefs.ErrNoRepository, status: http.StatusNotFound, fallback: "No GitHub repository found for this account", fixed: true},
	{err: errdefs.ErrNotFound, status: http.StatusNotFound, fallback: "Not found", named: true},
	{err: store.ErrNotFound, status: http.StatusNotFound, fallback: "Not found", fixed: true, named: true},
	{err: errdefs.ErrQuota, status: http.StatusTooManyRequests, fallback: "Over quota"},
	{err: errdefs.ErrInvalid, status: http.StatusBadRequest, fallback: "Invalid request"},
	{err: errdefs.ErrTooLarge, status: http.StatusRequestEntityTooLarge, fallback: "Too large"},
	{err: errdefs.ErrForbidden, status: http.StatusForbidden, fallback: "Forbidden"},
	// A refusal that says why (a pause refused while a run executes)
	// keeps its words; a bare not-running is the contract's message.
	{err: errdefs.ErrNotRunning, status: http.StatusConflict, fallback: "Sandbox is not running"},
	{err: errdefs.ErrConflict, status: http.StatusConflict, fallback: "Conflict"},
}

// Explain is what the caller is told of err: an *Error as it is, else the
// row of its class, with the user message errdefs carries (never the
// cause below it). notFound, when not empty, is the message of a 404 whose
// error says nothing better ("Sandbox not found"). Anything else is an
// internal error: internal is set, the answer is InternalMessage, and the
// front end logs err.
func Explain(err error, notFound string) (e *Error, internal bool) {
	if errors.As(err, &e) {
		return e, false
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return Errorf(http.StatusRequestEntityTooLarge, "Request body is larger than %d bytes", mbe.Limit), false
	}
	for _, c := range classes {
		if !errors.Is(err, c.err) {
			continue
		}
		msg := c.fallback
		if c.named && notFound != "" {
			msg = notFound
		}
		if !c.fixed {
			msg = errdefs.Message(err, msg)
		}
		return &Error{Status: c.status, Msg: msg, Echo: c.echo, Fields: c.fields}, false
	}
	return &Error{Status: http.StatusInternalServerError, Msg: InternalMessage}, true
}

// ScopeError is the 403 a sandbox's own key gets for what it may not do
// (auth.Principal.MayCall refused it): that key, in the hands of the code
// inside the sandbox, only reads. what names the operation ("POST
// /api/sandboxes", "the run_command tool").
func ScopeError(what string) *Error {
	return Errorf(http.StatusForbidden, "This key belongs to a sandbox and may only read (GET) the API, use the git server and the model proxy; %s needs an account key", what)
}

// Explained is err as Explain tells it (with notFound) when it is no
// internal error, else err itself: for a front end that answers err later,
// in one place that logs what is internal.
func Explained(err error, notFound string) error {
	if e, internal := Explain(err, notFound); !internal {
		return e
	}
	return err
}
