package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// New returns a client of the server at baseURL (such as
// http://127.0.0.1:8080) that sends key with every request. Options add
// to it: WithHTTPClient, WithRequestEditorFn.
func New(baseURL, key string, opts ...ClientOption) (*ClientWithResponses, error) {
	return NewClientWithResponses(baseURL, append([]ClientOption{WithAPIKey(key)}, opts...)...)
}

// WithAPIKey sends key as the x-api-key header, which the API takes as
// well as Authorization: Bearer.
func WithAPIKey(key string) ClientOption {
	return WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("x-api-key", key)
		return nil
	})
}

// Error is an answer of the API other than a success: its status and its
// body ({"status": "error", "error", "missing_fields"?}), whatever the
// status, documented or not (a 409 or a 501 too).
type Error struct {
	StatusCode int
	Body       ErrorBody
}

func (e *Error) Error() string {
	if e.Body.Error == "" {
		return fmt.Sprintf("HTTP %d", e.StatusCode)
	}
	return fmt.Sprintf("HTTP %d: %s", e.StatusCode, e.Body.Error)
}

// Response is what every answer of ClientWithResponses has.
type Response interface {
	StatusCode() int
	GetBody() []byte
}

// Check turns an answer that is not a success (2xx) into an *Error, so
// that a caller needs one test instead of one per documented status:
//
//	res, err := client.Check(c.GetSandboxesWithResponse(ctx, nil))
//
// A request that failed (err) is returned as it is.
func Check[R Response](r R, err error) (R, error) {
	if err != nil {
		return r, err
	}
	if code := r.StatusCode(); code < 200 || code > 299 {
		e := &Error{StatusCode: code}
		// A body that is not the API's (a proxy's page) leaves the
		// status alone to tell what happened.
		_ = json.Unmarshal(r.GetBody(), &e.Body)
		return r, e
	}
	return r, nil
}
