package edge

import "context"

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
