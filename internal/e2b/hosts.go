package e2b

import (
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/store"
)

// headerForwardedHost carries a port request's host to the node that
// hosts the sandbox: a forward is addressed to that node, so its Host is
// the node's. Trusted only on the cluster listener, whose requests are
// signed.
const headerForwardedHost = "Sandboxd-E2b-Host"

// headerTrafficToken carries a sandbox's traffic access token to its
// ports when they are not public (E2B's allowPublicTraffic false).
const headerTrafficToken = "E2b-Traffic-Access-Token"

// sandboxHost splits a host name of the E2B domain, PORT-ID.DOMAIN (what
// the SDKs' getHost(port) makes), into the sandbox id and the port; ok is
// false for any other host.
func (a *API) sandboxHost(host string) (id string, port int, ok bool) {
	if a.opts.Domain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, found := strings.CutSuffix(strings.ToLower(host), "."+a.opts.Domain)
	if !found || strings.Contains(label, ".") {
		return "", 0, false
	}
	p, id, found := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !found || err != nil || port < 1 || port > 65535 || id == "" {
		return "", 0, false
	}
	return sandboxID(id), port, true
}

// HostRouter serves requests for PORT-ID.DOMAIN hosts (see Options.Domain)
// and passes any other to next: the agent's port is the agent's routes,
// any other port the sandbox's own server there, through the port proxy.
// A sandbox's ports are public, as in E2B, unless it was created with
// allowPublicTraffic false: then a request must carry its traffic token.
func (a *API) HostRouter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if fh := r.Header.Get(headerForwardedHost); fh != "" && api.ViaCluster(r) {
			host = fh
			r.Host = fh // the sandbox's server sees the host the caller used
		}
		r.Header.Del(headerForwardedHost)
		id, port, ok := a.sandboxHost(host)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if strconv.Itoa(port) == envdPort {
			// The SDKs reach the agent here when no E2B_SANDBOX_URL is set;
			// they send E2b-Sandbox-Id as well, which must agree.
			if h := r.Header.Get(headerSandboxID); h != "" && sandboxID(h) != id {
				agentError(w, http.StatusBadRequest, "E2b-Sandbox-Id does not match the host")
				return
			}
			r.Header.Set(headerSandboxID, id)
			a.serveAgent(w, r)
			return
		}
		a.servePort(w, r, id, port)
	})
}

// servePort forwards r to port of sandbox id.
func (a *API) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	ctx := r.Context()
	via, ok := a.forwardedHere(w, r)
	if !ok {
		return
	}
	e, err := a.opts.Store.GetE2BSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		agentError(w, http.StatusNotFound, "sandbox "+e2bID(id)+" not found")
		return
	}
	if err != nil {
		a.log.ErrorContext(ctx, "e2b port route", "sandbox_id", id, "err", err)
		agentError(w, http.StatusInternalServerError, "internal error")
		return
	}
	if e.TrafficToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(headerTrafficToken)), []byte(e.TrafficToken)) != 1 {
		agentError(w, http.StatusForbidden, "sandbox "+e2bID(id)+" takes traffic only with its traffic access token")
		return
	}
	if c := a.opts.Cluster; c != nil && !via {
		if node, hosted := c.HostOf(ctx, id); hosted {
			r.Header.Set(headerForwardedHost, r.Host)
			c.Forward(w, r, node, agentForwardKey, false)
			return
		}
	}
	sb, err := a.opts.Store.GetSandbox(ctx, id)
	if err != nil || sb.Status != store.SandboxRunning || sb.Pause != "" {
		agentError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" is not running")
		return
	}
	if a.opts.Ports == nil {
		agentError(w, http.StatusNotImplemented, "this server has no port proxy")
		return
	}
	// The caller's own credentials for the sandbox's services stay: they
	// are the sandbox's business. The traffic token is sandboxd's.
	r.Header.Del(headerTrafficToken)
	a.opts.Ports.ServePort(w, r, id, port)
}
