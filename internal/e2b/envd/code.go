package envd

import (
	"context"
	"crypto/subtle"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
	"github.com/sandboxd/sandboxd/internal/store"
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
	if !codePath(r.URL.Path) && r.URL.Path != "/health" {
		writeError(w, http.StatusNotFound, "no such path: "+r.URL.Path)
		return
	}
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
	var t codeint.Target
	if edge.ViaCluster(r) {
		// The forwarding node resolved them.
		t = codeint.Target{User: r.Header.Get(userHeader), Dir: r.Header.Get(guest.CodeDirHeader), Env: r.Header.Values(guest.CodeEnvHeader)}
	} else {
		t = p.codeCaller(ctx, e)
	}
	if !userName.MatchString(t.User) {
		writeError(w, http.StatusBadRequest, "the sandbox's default user is not a valid user name")
		return
	}
	user := t.User
	// For the node that hosts it, and the agent.
	r.Header.Set(userHeader, user)
	r.Header.Del(guest.CodeEnvHeader)
	for _, kv := range t.Env {
		r.Header.Add(guest.CodeEnvHeader, kv)
	}
	r.Header.Set(guest.CodeDirHeader, t.Dir)
	// The node that hosts it takes the request by these whichever way it
	// came here (a host name is this node's only).
	r.Header.Set(headerSandboxID, E2BID(e.SandboxID))
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

// codeCaller is who code runs as in e's sandbox through E2B: its default
// user, directory and environment (its template's, then create's
// envVars), as E2B's commands.
func (p *Proxy) codeCaller(ctx context.Context, e store.E2BSandbox) codeint.Target {
	user, cwd, env := p.defaults(ctx, e)
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	maps.Copy(vars, e.EnvVars)
	t := codeint.Target{User: user, Dir: cwd}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		t.Env = append(t.Env, k+"="+vars[k])
	}
	return t
}

// WarmCode starts the default Python context of e's sandbox, hosted on
// this node, as E2B's code-interpreter SDK will use it: a create of its
// template starts its kernel, so that the first runCode does not wait for
// all of its boot. Best effort: a failure is logged, and the first
// execution starts the kernel itself.
func (p *Proxy) WarmCode(ctx context.Context, e store.E2BSandbox) {
	t := p.codeCaller(ctx, e)
	tr, err := p.opts.Agents.AgentTransport(ctx, tokenHolder(e), e.SandboxID)
	if err == nil {
		t.Transport = tr
		err = t.Warm(ctx, "python")
	}
	if err != nil && ctx.Err() == nil {
		p.log.WarnContext(ctx, "e2b code: start the default Python context ahead", "sandbox_id", e.SandboxID, "err", err)
	}
}
