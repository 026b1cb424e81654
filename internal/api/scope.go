package api

import (
	"net/http"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// checkScope refuses, with 403 and the reason, a request that the key's
// scope does not cover: a sandbox's own key (RECOUP_API_KEY, in the hands
// of the untrusted code inside) only reads, so that code cannot extend its
// sandbox, start sandboxes or runs, upload, or change or delete the
// account's environment. A route that acts though its method is GET (the
// exec websocket, a sandbox's files) counts as a POST, for the reason it
// gives.
func checkScope(r *http.Request, p auth.Principal, acts string) error {
	method, what := r.Method, r.Method+" "+r.URL.Path
	if acts != "" {
		method, what = http.MethodPost, what+" ("+acts+")"
	}
	if err := p.MayCall(method); err != nil {
		return edge.ScopeError(what)
	}
	return nil
}
