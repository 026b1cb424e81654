package envd

import (
	"crypto/subtle"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/guest"
)

// codePort is the port E2B's code-interpreter SDK addresses its server
// at (JUPYTER_PORT): the sandbox's agent serves it (guest.CodePath), so
// it is reached through sandboxd, never through a port open in the
// sandbox.
const codePort = "49999"

// serveCode forwards a request of E2B's code-interpreter SDK to sandbox
// id's agent. Its access rule is E2B's for a sandbox's ports, plus the
// sandbox's access token where the SDK sends it: a sandbox created with
// allowPublicTraffic false takes requests only with its traffic token;
// /execute, which runs code, needs the access token (X-Access-Token) as
// envd's routes do; the context routes, for which the SDK sends none,
// check it when it is sent. The kernels run as the sandbox's default user
// (its template's USER), in its WORKDIR, with its template's environment
// and create's envVars.
func (p *Proxy) serveCode(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	if r.Method == http.MethodOptions {
		preflight(w)
		return
	}
	w.Header().Set("Access-Control-Allow-Origin", "*")
	e, err := p.record(w, r, id, sandboxNotFound)
	if err != nil {
		return
	}
	if !trafficAllowed(w, r, e) {
		return
	}
	tok := r.Header.Get(headerAccessToken)
	if (tok != "" || r.URL.Path == "/execute") && subtle.ConstantTimeCompare([]byte(tok), []byte(e.AccessToken)) != 1 {
		writeError(w, http.StatusUnauthorized, errUnauthorized.Error())
		return
	}
	user, cwd, env := p.defaults(ctx, e)
	if edge.ViaCluster(r) {
		// The forwarding node resolved them.
		user, cwd, env = r.Header.Get(userHeader), r.Header.Get(guest.CodeDirHeader), r.Header.Values(guest.CodeEnvHeader)
	}
	if !userName.MatchString(user) {
		writeError(w, http.StatusBadRequest, "the sandbox's default user is not a valid user name")
		return
	}
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	if !edge.ViaCluster(r) {
		maps.Copy(vars, e.EnvVars)
	}
	r.Header.Set(userHeader, user) // for the node that hosts it
	r.Header.Del(guest.CodeEnvHeader)
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		r.Header.Add(guest.CodeEnvHeader, k+"="+vars[k])
	}
	r.Header.Set(guest.CodeDirHeader, cwd)
	r.Header.Set(headerSandboxPort, codePort)
	if p.opts.Gate.ForwardIfElsewhere(w, r, forwarder(r), e.SandboxID) {
		return
	}
	tr, ok := p.transport(w, r, e)
	if !ok {
		return
	}
	p.forward(w, r, tr, user, func(out *http.Request) {
		out.URL.Path, out.URL.RawPath = guest.CodePath+r.URL.Path, ""
		out.URL.RawQuery = "" // 2.8's ?source= says who calls; nothing to serve
	})
}

// preflight answers a browser's preflight (the SDK's E2b-Sandbox-*
// headers need one) as E2B's server does: every origin.
func preflight(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "*")
	w.WriteHeader(http.StatusNoContent)
}

// codePath reports whether p is one of the code interpreter's paths.
func codePath(p string) bool {
	return p == "/execute" || p == "/contexts" || strings.HasPrefix(p, "/contexts/")
}
