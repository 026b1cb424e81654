package repo

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/auth"
)

// GitPathPrefix is where the git server is mounted: /git/<account-id>.git.
const GitPathPrefix = "/git/"

// Authorizer is the access rule of the git server: who a key is, whether
// it may read an account's repository (fetch, clone) and whether it may
// write it (push) — the one write rule, which commits into submodules
// follow too. *auth.Authenticator is one.
type Authorizer interface {
	Authenticate(ctx context.Context, key string) (auth.Principal, error)
	MayRead(ctx context.Context, p auth.Principal, accountID string) (bool, error)
	MayWrite(ctx context.Context, p auth.Principal, accountID string) (bool, error)
}

// GitHTTPHandler serves the repositories over git smart HTTP (clone, fetch,
// push) at /git/<account-id>.git/..., running git http-backend as a CGI
// program. Callers authenticate with HTTP Basic auth whose password is an
// API key (the user name is ignored; a key given as the user name with an
// empty password works too, and so does Authorization: Bearer). Missing or
// bad keys get 401 with a Basic challenge; repositories the key may not act
// for are 404, never 403, so account ids cannot be probed. A repository is
// created on the first request of an authorised caller, so a new account
// can clone (empty) and push at once. Only the smart protocol's three
// endpoints are served. A repeated query parameter is 400 and repeated
// Authorization headers are 401, so that the access check and git never
// read different values. Pushes run one at a time per repository, bounded
// by receive.maxInputSize and a pre-receive hook that enforces the object
// limit and the account's repository quota (see pushEnv).
func (m *Manager) GitHTTPHandler(a Authorizer) http.Handler {
	return &gitServer{m: m, auth: a, log: m.log}
}

type gitServer struct {
	m    *Manager
	auth Authorizer
	log  *slog.Logger
}

// smartService returns the git service a request asks for, or "" when it
// is not one of the smart protocol's requests. query is the request's
// parsed query, without repeated parameters.
func smartService(r *http.Request, rest string, query url.Values) string {
	switch {
	case rest == "info/refs" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		switch s := query.Get("service"); s {
		case "git-upload-pack", "git-receive-pack":
			return s
		}
	case (rest == "git-upload-pack" || rest == "git-receive-pack") && r.Method == http.MethodPost:
		return rest
	}
	return ""
}

func (g *gitServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tail, ok := strings.CutPrefix(r.URL.Path, GitPathPrefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	repoName, rest, _ := strings.Cut(tail, "/")
	// The access check and http-backend must see the same service: a
	// parameter given twice (authorised on the first value, executed on
	// the last) or a query Go and git would split differently is refused.
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		http.Error(w, "malformed query", http.StatusBadRequest)
		return
	}
	for k, v := range query {
		if len(v) > 1 {
			http.Error(w, "query parameter "+strconv.Quote(k)+" given more than once", http.StatusBadRequest)
			return
		}
	}
	service := smartService(r, rest, query)
	if service == "" {
		http.NotFound(w, r)
		return
	}

	p, ok := g.principal(w, r)
	if !ok {
		return
	}
	id, err := CanonicalID(strings.TrimSuffix(repoName, ".git"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	may := g.auth.MayWrite
	if service == "git-upload-pack" {
		may = g.auth.MayRead
	}
	allowed, err := may(r.Context(), p, id)
	if err != nil {
		g.log.ErrorContext(r.Context(), "git: check access", "account", id, "err", err)
		http.Error(w, "internal server error", http.StatusInternalServerError)
		return
	}
	if !allowed {
		http.NotFound(w, r)
		return
	}
	if _, err := g.m.Ensure(r.Context(), id); err != nil {
		g.log.ErrorContext(r.Context(), "git: create repository", "account", id, "err", err)
		http.Error(w, "internal server error", http.StatusInternalServerError)
		return
	}

	// http-backend sees the canonical name whatever the caller typed, and
	// never the key: CGI would hand every header to it as HTTP_*.
	r2 := r.Clone(r.Context())
	r2.URL.Path = GitPathPrefix + id + ".git/" + rest
	r2.URL.RawPath = ""
	r2.URL.RawQuery = query.Encode()
	r2.Header.Del("Authorization")
	push := rest == "git-receive-pack"
	if push {
		// One push at a time per repository: the hook's quota check sees
		// the repository and this push only, never another push's
		// quarantine that is about to land too.
		l := g.m.lock(g.m.root + "\x00push\x00" + id)
		l.Lock()
		defer l.Unlock()
	}
	if r2.ContentLength < 0 && r.Method == http.MethodPost {
		// CGI needs a length, and git sends pushes over 1 MiB chunked.
		body, n, err := g.spool(r.Body, g.m.maxBody())
		if body != nil {
			defer func() { body.Close(); os.Remove(body.Name()) }()
		}
		if errors.Is(err, errBodyTooLarge) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err != nil {
			g.log.ErrorContext(r.Context(), "git: spool request body", "account", id, "err", err)
			http.Error(w, "internal server error", http.StatusInternalServerError)
			return
		}
		r2.Body, r2.ContentLength, r2.TransferEncoding = body, n, nil
	}
	// Only what http-backend needs: the server's own environment may
	// hold secrets that git has no use for. CGI adds PATH.
	env := append(append([]string{}, gitSettings...),
		"GIT_PROJECT_ROOT="+g.m.root,
		"GIT_HTTP_EXPORT_ALL=1",
		// REMOTE_USER enables receive-pack and names the pusher in the
		// reflog.
		"REMOTE_USER="+p.AccountID,
	)
	if push {
		env = append(env, g.m.pushEnv()...)
	}
	h := &cgi.Handler{
		Path:   g.m.git,
		Args:   []string{"http-backend"},
		Root:   strings.TrimSuffix(GitPathPrefix, "/"),
		Env:    env,
		Stderr: &logWriter{log: g.log, ctx: r.Context(), account: id},
	}
	if push && g.m.shared != nil {
		// In a cluster a push is acknowledged only once it is published:
		// git's answer (its report of the refs updated) waits until then.
		var answer bufferedResponse
		err := g.m.change(r.Context(), id, func(ctx context.Context, _ string) error {
			h.ServeHTTP(&answer, r2.WithContext(ctx))
			return nil
		})
		if err != nil {
			g.log.ErrorContext(r.Context(), "git push: publish", "account", id, "err", err)
			http.Error(w, "the push could not be stored for the whole cluster; push again", http.StatusServiceUnavailable)
			return
		}
		answer.writeTo(w)
	} else {
		h.ServeHTTP(w, r2)
	}
	if push {
		g.log.InfoContext(r.Context(), "git push", "account", id, "by", p.AccountID, "key", p.KeyID)
	}
}

// bufferedResponse holds a response until it may be sent (a push's, until
// it is published). git's answer to a push is its report of the refs
// updated, with progress: small.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header {
	if b.header == nil {
		b.header = http.Header{}
	}
	return b.header
}

func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

// writeTo sends the held response to w.
func (b *bufferedResponse) writeTo(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	if b.code == 0 {
		b.code = http.StatusOK
	}
	w.WriteHeader(b.code)
	_, _ = w.Write(b.body.Bytes())
}

// maxSpooledBody caps a chunked request body (a push) when pushes have
// no size limit.
const maxSpooledBody = 4 << 30

// maxBody is the largest chunked request body spooled: a push's pack is
// bounded by receive.maxInputSize (see pushEnv), and its commands take
// little beside it.
func (m *Manager) maxBody() int64 {
	limit := m.pushLimit()
	if limit <= 0 || limit > maxSpooledBody {
		return maxSpooledBody
	}
	return limit + 1<<20
}

var errBodyTooLarge = errors.New("request body too large")

// spool copies a request body of unknown length, at most max bytes, to a
// temporary file beside the repositories and returns it rewound, with its
// length.
func (g *gitServer) spool(body io.Reader, max int64) (*os.File, int64, error) {
	f, err := os.CreateTemp(g.m.root, ".body-")
	if err != nil {
		return nil, 0, err
	}
	n, err := io.Copy(f, io.LimitReader(body, max+1))
	if err != nil {
		return f, n, err
	}
	if n > max {
		return f, n, errBodyTooLarge
	}
	_, err = f.Seek(0, io.SeekStart)
	return f, n, err
}

// principal authenticates the request or answers 401.
func (g *gitServer) principal(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	if len(r.Header.Values("Authorization")) > 1 {
		// As the API does (auth.KeyFromHeaders): which of two credentials
		// counts must not depend on who reads the headers.
		challenge(w)
		return auth.Principal{}, false
	}
	key := keyOf(r)
	if key == "" {
		challenge(w)
		return auth.Principal{}, false
	}
	p, err := g.auth.Authenticate(r.Context(), key)
	if errors.Is(err, auth.ErrUnauthorized) {
		challenge(w)
		return auth.Principal{}, false
	}
	if err != nil {
		g.log.ErrorContext(r.Context(), "git: authenticate", "err", err)
		http.Error(w, "internal server error", http.StatusInternalServerError)
		return auth.Principal{}, false
	}
	return p, true
}

// keyOf finds the API key: the Basic password (or user name when the
// password is empty, as in https://KEY@host/...), or a Bearer token.
func keyOf(r *http.Request) string {
	if user, pass, ok := r.BasicAuth(); ok {
		if pass != "" {
			return pass
		}
		return user
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(token)
	}
	return ""
}

func challenge(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Basic realm="sandboxd"`)
	http.Error(w, "authentication required: use an API key as the password", http.StatusUnauthorized)
}

// logWriter sends http-backend's standard error to the log.
type logWriter struct {
	log     *slog.Logger
	ctx     context.Context
	account string
}

func (l *logWriter) Write(b []byte) (int, error) {
	if msg := strings.TrimSpace(string(b)); msg != "" {
		l.log.WarnContext(l.ctx, "git http-backend", "account", l.account, "stderr", msg)
	}
	return len(b), nil
}
