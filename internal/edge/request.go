package edge

import (
	"context"
	"net/url"
)

type requestIDKey struct{}

// WithRequestID is ctx carrying the id of its request (the router's, that
// logs and answers it as X-Request-Id), for every front end's log lines.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the id of ctx's request; "" when the router gave none.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// Unescaped is a path parameter as its client meant it: clients escape
// characters of a value that the router hands over as sent (the ':' of a
// template's or snapshot's name:tag is %3A); a value that is not a valid
// escape is taken as it is.
func Unescaped(v string) string {
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}
