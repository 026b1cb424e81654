package envd

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

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/guest"
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

// forwarder is the caller a request of this plane is forwarded as: no key
// (agentForwardKey), and never forwarded again once another node did
// (edge.ViaCluster: that node signed it, edge.ClusterHandler checked).
func forwarder(r *http.Request) edge.Caller {
	return edge.Caller{Principal: auth.Principal{KeyID: agentForwardKey}, Forwarded: edge.ViaCluster(r)}
}

// serveAgent forwards a request for a sandbox's agent (envd's paths) to
// that sandbox's guest agent, once the caller has shown the sandbox's
// access token (or a file link signed with it). /health needs no token, as
// envd's: it says only whether the sandbox's agent answers.
func (p *Proxy) serveAgent(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if r.Method == http.MethodOptions && codePath(r.URL.Path) {
		// A browser's preflight carries no header values: the SDK's
		// E2b-Sandbox-Port comes with the request itself.
		preflight(w)
		return
	}
	if r.Header.Get(headerSandboxPort) == codePort && r.Header.Get(headerSandboxID) != "" {
		// E2B's code-interpreter SDK with E2B_SANDBOX_URL set: the same
		// URL as envd's, the port in the header.
		p.serveCode(w, r, SandboxID(r.Header.Get(headerSandboxID)))
		return
	}
	if !envdPath(r.URL.Path) {
		// The agent serves sandboxd's own services beside envd's (freeze,
		// export, unpack): they are the host's, never a caller's.
		writeError(w, http.StatusNotFound, "no such path: "+r.URL.Path)
		return
	}
	id := SandboxID(r.Header.Get(headerSandboxID))
	if port := r.Header.Get(headerSandboxPort); port != "" && port != envdPort {
		writeError(w, http.StatusBadRequest, "E2b-Sandbox-Port "+port+": only the agent's port "+envdPort+" and the code interpreter's "+codePort+" are served here; reach a sandbox's own ports through its host (getHost) or sandboxd's port proxy")
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
		e, err = p.signedFor(ctx, r)
		if err != nil {
			writeError(w, http.StatusUnauthorized, err.Error())
			return
		}
		signed = true
	case id == "":
		writeError(w, http.StatusBadRequest, "no E2b-Sandbox-Id header: say which sandbox the request is for")
		return
	default:
		if e, err = p.record(w, r, id, agentNotFound); err != nil {
			return
		}
		if r.URL.Path != "/health" {
			var refused error
			if signed, refused = p.authorized(r, e); refused != nil {
				writeError(w, http.StatusUnauthorized, refused.Error())
				return
			}
		}
	}
	dflt, cwd, env := p.defaults(ctx, e)
	user, ok := requestUser(r, dflt)
	if signed {
		// The link acts as exactly the user it was signed for.
		user, ok = signedUser(r, dflt)
	}
	if edge.ViaCluster(r) {
		// The forwarding node resolved it; the caller's Authorization did
		// not travel.
		user = r.Header.Get(userHeader)
		ok = userName.MatchString(user)
	}
	if !ok {
		writeError(w, http.StatusBadRequest, "the user the request names is not a valid user name")
		return
	}
	r.Header.Set(userHeader, user)
	if p.opts.Gate.ForwardIfElsewhere(w, r, forwarder(r), e.SandboxID) {
		return
	}
	tr, ok := p.transport(w, r, e)
	if !ok {
		return
	}
	if r.URL.Path == processconnect.ProcessStartProcedure {
		p.start.ServeHTTP(w, r.WithContext(context.WithValue(ctx, startTargetKey{}, startTarget{tr: tr, e: e, user: user, cwd: cwd, env: env})))
		return
	}
	p.forward(w, r, tr, user, func(out *http.Request) { out.Header.Set(guest.EnvdHeader, "1") })
}

// envdPath reports whether p is one of envd's paths (Routes), the only
// ones forwarded to an agent, whichever way the request came (a route, or
// a sandbox's host name).
func envdPath(p string) bool {
	switch p {
	case "/files", "/health":
		return true
	}
	return strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

// defaults are the user a request that names none acts as in e's
// sandbox, the directory its processes start in when they name none, and
// the environment they start with: its template's USER (root when the
// template has none), WORKDIR and ENV, as E2B's templates set them; the
// server's DefaultUser and the agent's directory for a sandbox of the
// built-in image, or when the template cannot be read here.
func (p *Proxy) defaults(ctx context.Context, e store.E2BSandbox) (user, cwd string, env []string) {
	d, ok := p.opts.Agents.(TemplateDefaults)
	if !ok || e.SandboxID == "" {
		return p.opts.DefaultUser, "", nil
	}
	sb, err := p.opts.Store.GetSandbox(ctx, e.SandboxID)
	if err != nil || sb.TemplateID == "" {
		return p.opts.DefaultUser, "", nil
	}
	if b, ok := d.(builtinBased); ok && b.StandsOnBuiltin(ctx, sb) {
		// The files of a sandbox of the built-in image, saved (a named
		// snapshot, a pause of its files): its defaults are that
		// sandbox's.
		return p.opts.DefaultUser, "", nil
	}
	cwd, user, err = d.ExecDefaults(ctx, sb)
	if err == nil {
		env, err = d.TemplateEnv(ctx, sb)
	}
	if err != nil {
		p.log.WarnContext(ctx, "e2b envd: the template's user, directory and environment", "sandbox_id", sb.ID, "err", err)
		return p.opts.DefaultUser, "", nil
	}
	if user == "" {
		user = "root"
	}
	return user, cwd, env
}

// builtinBased says a sandbox's template is the built-in image's files
// saved (package sandbox's Manager: StandsOnBuiltin).
type builtinBased interface {
	StandsOnBuiltin(ctx context.Context, sb store.Sandbox) bool
}

// TemplateDefaults gives a sandbox's template's directory and user of the
// commands that name none, and its environment (package sandbox's
// Manager).
type TemplateDefaults interface {
	ExecDefaults(ctx context.Context, sb store.Sandbox) (cwd, user string, err error)
	TemplateEnv(ctx context.Context, sb store.Sandbox) ([]string, error)
}

// record is sandbox id's E2B record; when there is none (notFound answers
// in the caller's words), or it cannot be read, the answer is written and
// err is not nil.
func (p *Proxy) record(w http.ResponseWriter, r *http.Request, id string, notFound func(http.ResponseWriter, string)) (store.E2BSandbox, error) {
	e, err := p.opts.Store.GetE2BSandbox(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, id)
	case err != nil:
		p.log.ErrorContext(r.Context(), "e2b envd: read the sandbox's record", "sandbox_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, edge.InternalMessage)
	}
	return e, err
}

// agentNotFound is the agent routes' answer for a sandbox with no record.
func agentNotFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, "sandbox "+E2BID(id)+" not found")
}

// transport is the way to e's guest agent; when there is none (the
// sandbox is paused, or gone) the answer is written and ok is false, 502
// as envd's proxy answers. Whether the sandbox runs here is the sandbox
// manager's to say (AgentTransport); this plane only keeps a paused
// sandbox asleep, which AgentTransport would wake: isRunning() of a
// paused sandbox is false, not a resume. One created with autoResume is
// woken: the request waits for its resume.
func (p *Proxy) transport(w http.ResponseWriter, r *http.Request, e store.E2BSandbox) (http.RoundTripper, bool) {
	ctx := r.Context()
	notRunning := "sandbox " + E2BID(e.SandboxID) + " is not running"
	if sb, err := p.opts.Store.GetSandbox(ctx, e.SandboxID); err != nil || (sb.Pause != "" && !e.AutoResume) {
		writeError(w, http.StatusBadGateway, notRunning)
		return nil, false
	}
	tr, err := p.opts.Agents.AgentTransport(ctx, tokenHolder(e), e.SandboxID)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotRunning) && !errors.Is(err, errdefs.ErrNotFound) {
			p.log.WarnContext(ctx, "e2b envd: reach the agent", "sandbox_id", e.SandboxID, "err", err)
		}
		writeError(w, http.StatusBadGateway, notRunning)
		return nil, false
	}
	return tr, true
}

// tokenHolder is who a request that showed e's access token (or a link
// signed with it) acts as: e's account, for e's sandbox alone.
func tokenHolder(e store.E2BSandbox) auth.Principal {
	return auth.Principal{AccountID: e.AccountID, SandboxID: e.SandboxID}
}

// authorized lets r in when it carries e's access token, or, for /files,
// a valid signature made with it (signed); refused says why not, in
// envd's words (the SDK's users match on them).
func (p *Proxy) authorized(r *http.Request, e store.E2BSandbox) (signed bool, refused error) {
	tok := r.Header.Get(headerAccessToken)
	if r.URL.Path != "/files" {
		if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(e.AccessToken)) != 1 {
			return false, errUnauthorized
		}
		return false, nil
	}
	switch {
	case tok != "":
		if subtle.ConstantTimeCompare([]byte(tok), []byte(e.AccessToken)) != 1 {
			return false, errTokenMismatch
		}
		return false, nil
	case !r.URL.Query().Has("signature"):
		return false, errNoSignature
	}
	return true, p.signatureValid(r, e.AccessToken)
}

// signedFor finds the sandbox whose token signed r's file link.
func (p *Proxy) signedFor(ctx context.Context, r *http.Request) (store.E2BSandbox, error) {
	node := p.opts.NodeID
	if p.opts.Gate.Clustered() {
		node = "" // the link may be for a sandbox another node hosts
	}
	cands, err := p.opts.Store.ListLiveE2BSandboxesOn(ctx, node)
	if err != nil {
		p.log.ErrorContext(ctx, "e2b envd: list the sandboxes a link may be for", "err", err)
		return store.E2BSandbox{}, errors.New("cannot check the link's signature now")
	}
	var last = errBadSignature // a link that matches no sandbox
	for _, e := range cands {
		err := p.signatureValid(r, e.AccessToken)
		if err == nil {
			return e, nil
		}
		if errors.Is(err, errExpired) {
			last = err
		}
	}
	return store.E2BSandbox{}, last
}

// What a request is told when its token or link lets nothing in: envd's
// words, never a cause's. A link that names no sandbox and matches none
// is, to its holder, an invalid signature (signedFor).
var (
	errUnauthorized  = errors.New("unauthorized access, please provide a valid access token or method signing if supported")
	errTokenMismatch = errors.New("access token present in header but does not match")
	errNoSignature   = errors.New("missing signature query parameter")
	errBadSignature  = errors.New("invalid signature")
	errExpired       = errors.New("signature is already expired")
)

// signatureValid checks a file link's signature as envd does:
// "v1_" + base64(sha256("path:operation:username:token[:expiration]")),
// padding removed, operation "read" for GET and "write" for POST.
func (p *Proxy) signatureValid(r *http.Request, token string) error {
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
		if p.opts.Now().After(time.Unix(n, 0)) {
			if sigEqual(q.Get("signature"), raw) {
				return errExpired
			}
			return errBadSignature
		}
	}
	if !sigEqual(q.Get("signature"), raw) {
		return errBadSignature
	}
	return nil
}

func sigEqual(sig, raw string) bool {
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// forward sends r to the agent over tr, without the caller's credentials
// and routing headers, streaming both ways (Connect's server streams), as
// user; rewrite, when given, changes the outgoing request further.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, tr http.RoundTripper, user string, rewrite func(out *http.Request)) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "agent", "agent"
			for _, h := range []string{headerAccessToken, headerSandboxID, headerSandboxPort, headerTrafficToken, "Authorization", "X-Api-Key", "Cookie"} {
				pr.Out.Header.Del(h)
			}
			pr.Out.Header.Set(userHeader, user)
			if rewrite != nil {
				rewrite(pr.Out)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				p.log.WarnContext(r.Context(), "e2b envd: forward", "path", r.URL.Path, "err", err)
			}
			writeError(w, http.StatusBadGateway, "the sandbox's agent did not answer")
		},
	}
	rp.ServeHTTP(w, r)
}
