package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Headers of E2B's requests to a sandbox's agent.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
)

// agentForwardKey stands for the key of a forwarded agent request, which
// has none: the sandbox's access token authenticates it, on both nodes.
const agentForwardKey = "e2b-agent"

// envdPort is the port E2B's SDKs address the agent at; any other port is
// a service of the sandbox's own, which this route does not reach.
const envdPort = "49983"

// agentError writes an error as envd does: {"code", "message"}.
func agentError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, &apiError{Code: code, Message: msg})
}

// serveAgent forwards a request for a sandbox's agent (envd's paths) to
// that sandbox's guest agent, once the caller has shown the sandbox's
// access token (or a file link signed with it). /health needs no token, as
// envd's: it says only whether the sandbox's agent answers.
func (a *API) serveAgent(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	via, ok := a.forwardedHere(w, r)
	if !ok {
		return
	}
	id := sandboxID(r.Header.Get(headerSandboxID))
	if port := r.Header.Get(headerSandboxPort); port != "" && port != envdPort {
		agentError(w, http.StatusBadRequest, "E2b-Sandbox-Port "+port+": only the agent's port "+envdPort+" is served here; reach a sandbox's own ports through its host (getHost) or sandboxd's port proxy")
		return
	}
	var (
		e   store.E2BSandbox
		err error
		// signed: a file link's signature, not the token, let r in.
		signed bool
	)
	switch {
	case id == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "":
		// A signed link names no sandbox: it is the sandbox whose token
		// signed it, among the running ones (of the whole cluster, in one).
		e, err = a.signedFor(ctx, r)
		if err != nil {
			agentError(w, http.StatusUnauthorized, err.Error())
			return
		}
		signed = true
	case id == "":
		agentError(w, http.StatusBadRequest, "no E2b-Sandbox-Id header: say which sandbox the request is for")
		return
	default:
		if e, err = a.opts.Store.GetE2BSandbox(ctx, id); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				agentError(w, http.StatusNotFound, "sandbox "+e2bID(id)+" not found")
			} else {
				a.log.ErrorContext(ctx, "e2b agent route", "sandbox_id", id, "err", err)
				agentError(w, http.StatusInternalServerError, "internal error")
			}
			return
		}
		if r.URL.Path != "/health" {
			var ok bool
			if ok, signed = a.authorized(r, e); !ok {
				agentError(w, http.StatusUnauthorized, "invalid access token for sandbox "+e2bID(id))
				return
			}
		}
	}
	user, ok := requestUser(r, a.opts.DefaultUser)
	if signed {
		// The link acts as exactly the user it was signed for.
		user, ok = signedUser(r, a.opts.DefaultUser)
	}
	if via {
		// The forwarding node resolved it; the caller's Authorization did
		// not travel.
		user = r.Header.Get(userHeader)
		ok = userName.MatchString(user)
	}
	if !ok {
		agentError(w, http.StatusBadRequest, "the user the request names is not a valid user name")
		return
	}
	if c := a.opts.Cluster; c != nil && !via {
		if node, hosted := c.HostOf(ctx, e.SandboxID); hosted {
			r.Header.Set(userHeader, user)
			c.Forward(w, r, node, agentForwardKey, false)
			return
		}
	}
	sb, err := a.opts.Store.GetSandbox(ctx, e.SandboxID)
	if err != nil {
		agentError(w, http.StatusBadGateway, "sandbox "+e2bID(e.SandboxID)+" is not running")
		return
	}
	if sb.Status != store.SandboxRunning || sb.Pause != "" {
		// What envd's proxy answers for a sandbox that is paused or gone.
		agentError(w, http.StatusBadGateway, "sandbox "+e2bID(e.SandboxID)+" is not running")
		return
	}
	// The access token checked above stands for the sandbox's own account.
	owner := auth.Principal{AccountID: sb.AccountID, SandboxID: sb.ID}
	tr, err := a.opts.Sandboxes.AgentTransport(ctx, owner, sb.ID)
	if err != nil {
		code := http.StatusBadGateway
		if !errors.Is(err, errdefs.ErrNotRunning) {
			a.log.WarnContext(ctx, "e2b agent route: reach the agent", "sandbox_id", sb.ID, "err", err)
		}
		agentError(w, code, "sandbox "+e2bID(e.SandboxID)+" is not running")
		return
	}
	if r.URL.Path == processconnect.ProcessStartProcedure {
		a.start.ServeHTTP(w, r.WithContext(context.WithValue(ctx, startTargetKey{}, startTarget{tr: tr, e: e, user: user})))
		return
	}
	a.forward(w, r, tr, user)
}

// authorized reports whether r carries e's access token, or, for /files,
// a valid signature made with it (signed).
func (a *API) authorized(r *http.Request, e store.E2BSandbox) (ok, signed bool) {
	if tok := r.Header.Get(headerAccessToken); tok != "" {
		return subtle.ConstantTimeCompare([]byte(tok), []byte(e.AccessToken)) == 1, false
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		return a.signatureValid(r, e.AccessToken) == nil, true
	}
	return false, false
}

// signedFor finds the sandbox whose token signed r's file link.
func (a *API) signedFor(ctx context.Context, r *http.Request) (store.E2BSandbox, error) {
	node := a.opts.NodeID
	if a.opts.Cluster != nil {
		node = "" // the link may be for a sandbox another node hosts
	}
	cands, err := a.opts.Store.ListLiveE2BSandboxesOn(ctx, node)
	if err != nil {
		return store.E2BSandbox{}, errors.New("cannot check the link's signature now")
	}
	var last error = errors.New("the link's signature matches no sandbox running here")
	for _, e := range cands {
		err := a.signatureValid(r, e.AccessToken)
		if err == nil {
			return e, nil
		}
		if errors.Is(err, errExpired) {
			last = err
		}
	}
	return store.E2BSandbox{}, last
}

var errExpired = errors.New("the link has expired")

// signatureValid checks a file link's signature as envd does:
// "v1_" + base64(sha256("path:operation:username:token[:expiration]")),
// padding removed, operation "read" for GET and "write" for POST.
func (a *API) signatureValid(r *http.Request, token string) error {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return errors.New("bad signature_expiration")
		}
		raw += ":" + exp
		if a.opts.Now().After(time.Unix(n, 0)) {
			if sigEqual(q.Get("signature"), raw) {
				return errExpired
			}
			return errors.New("bad signature")
		}
	}
	if !sigEqual(q.Get("signature"), raw) {
		return errors.New("bad signature")
	}
	return nil
}

func sigEqual(sig, raw string) bool {
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// forward sends r to the agent over tr, without the caller's credentials
// and routing headers, streaming both ways (Connect's server streams).
func (a *API) forward(w http.ResponseWriter, r *http.Request, tr http.RoundTripper, user string) {
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "agent", "agent"
			for _, h := range []string{headerAccessToken, headerSandboxID, headerSandboxPort, "Authorization", "X-Api-Key", "Cookie"} {
				pr.Out.Header.Del(h)
			}
			pr.Out.Header.Set(userHeader, user)
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				a.log.WarnContext(r.Context(), "e2b agent route: forward", "path", r.URL.Path, "err", err)
			}
			agentError(w, http.StatusBadGateway, "the sandbox's agent did not answer")
		},
	}
	p.ServeHTTP(w, r)
}

// forwardedHere says whether r came in on the cluster listener (via),
// checking then that another node signed it; when it did not, the
// refusal is written and ok is false. Such a request's sandbox token (or
// port rules) are checked here again all the same.
func (a *API) forwardedHere(w http.ResponseWriter, r *http.Request) (via, ok bool) {
	if !api.ViaCluster(r) {
		return false, true
	}
	if a.opts.Cluster == nil {
		agentError(w, http.StatusUnauthorized, "not part of a cluster")
		return true, false
	}
	if _, _, err := a.opts.Cluster.Forwarded(r); err != nil {
		a.log.WarnContext(r.Context(), "refused a request on the cluster listener", "err", err, "remote", r.RemoteAddr)
		agentError(w, http.StatusUnauthorized, "bad signature")
		return true, false
	}
	return true, true
}
