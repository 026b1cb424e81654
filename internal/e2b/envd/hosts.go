package envd

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/edge"
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
func (p *Proxy) sandboxHost(host string) (id string, port int, ok bool) {
	if p.opts.Domain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, found := strings.CutSuffix(strings.ToLower(host), "."+p.opts.Domain)
	if !found || strings.Contains(label, ".") {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label, "-")
	port, err := strconv.Atoi(ps)
	if !found || err != nil || port < 1 || port > 65535 || id == "" {
		return "", 0, false
	}
	return SandboxID(id), port, true
}

// HostRouter serves requests for PORT-ID.DOMAIN hosts (see Options.Domain)
// and passes any other to next: the agent's port is the agent's routes,
// any other port the sandbox's own server there, through the port proxy.
// A sandbox's ports are public, as in E2B, unless it was created with
// allowPublicTraffic false: then a request must carry its traffic token.
func (p *Proxy) HostRouter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if fh := r.Header.Get(headerForwardedHost); fh != "" && edge.ViaCluster(r) {
			host = fh
			r.Host = fh // the sandbox's server sees the host the caller used
		}
		r.Header.Del(headerForwardedHost)
		id, port, ok := p.sandboxHost(host)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if strconv.Itoa(port) == envdPort {
			// The SDKs reach the agent here when no E2B_SANDBOX_URL is set;
			// they send E2b-Sandbox-Id as well, which must agree.
			if h := r.Header.Get(headerSandboxID); h != "" && SandboxID(h) != id {
				writeError(w, http.StatusBadRequest, "E2b-Sandbox-Id does not match the host")
				return
			}
			r.Header.Set(headerSandboxID, id)
			p.serveAgent(w, r)
			return
		}
		if strconv.Itoa(port) == codePort {
			if h := r.Header.Get(headerSandboxID); h != "" && SandboxID(h) != id {
				writeError(w, http.StatusBadRequest, "E2b-Sandbox-Id does not match the host")
				return
			}
			p.serveCode(w, r, id)
			return
		}
		p.servePort(w, r, id, port)
	})
}

// servePort forwards r to port of sandbox id. A sandbox that is gone (or
// not running) and a port nothing answers on get E2B's edge's answers,
// which the SDKs and E2B's clients know: 502 with the sandbox's id.
func (p *Proxy) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	e, err := p.record(w, r, id, sandboxNotFound)
	if err != nil {
		return
	}
	if !trafficAllowed(w, r, e) {
		return
	}
	r.Header.Set(headerForwardedHost, r.Host)
	if p.opts.Gate.ForwardIfElsewhere(w, r, forwarder(r), id) {
		return
	}
	r.Header.Del(headerForwardedHost)
	sb, err := p.opts.Store.GetSandbox(r.Context(), id)
	// A paused sandbox stays asleep unless it was created with autoResume:
	// then the port proxy resumes it and the request waits for it.
	if err != nil || sb.Status != store.SandboxRunning || (sb.Pause != "" && !e.AutoResume) {
		sandboxNotFound(w, id)
		return
	}
	if p.opts.Ports == nil {
		writeError(w, http.StatusNotImplemented, "this server has no port proxy")
		return
	}
	// The caller's own credentials for the sandbox's services stay: they
	// are the sandbox's business. The traffic token is sandboxd's.
	r.Header.Del(headerTrafficToken)
	p.opts.Ports.ServePort(w, r, id, port, func(w http.ResponseWriter) {
		WriteJSON(w, http.StatusBadGateway, portClosed{SandboxID: E2BID(id), Message: "The sandbox is running but port is not open", Port: port, Code: http.StatusBadGateway})
	})
}

// E2B's edge's answers for a port it cannot reach, field for field.
type (
	sandboxGone struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}
	portClosed struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Port      int    `json:"port"`
		Code      int    `json:"code"`
	}
)

// sandboxNotFound is E2B's answer for a port of a sandbox that is gone,
// paused or stopped.
func sandboxNotFound(w http.ResponseWriter, id string) {
	WriteJSON(w, http.StatusBadGateway, sandboxGone{SandboxID: E2BID(id), Message: "The sandbox was not found", Code: http.StatusBadGateway})
}

// trafficAllowed lets r reach e's ports: any request when they are public,
// else one with e's traffic token; otherwise it answers 403.
func trafficAllowed(w http.ResponseWriter, r *http.Request, e store.E2BSandbox) bool {
	if e.TrafficToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(headerTrafficToken)), []byte(e.TrafficToken)) != 1 {
		writeError(w, http.StatusForbidden, "sandbox "+E2BID(e.SandboxID)+" takes traffic only with its traffic access token")
		return false
	}
	return true
}
