package oci_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// tokenService makes a registry behave as Docker's token-authenticated
// registries do: the registry answers 401 with a Bearer challenge whose
// realm is its token service (/token on the same server), which takes
// Basic credentials and answers a token the registry then accepts.
type tokenService struct {
	user, password string
	mu             sync.Mutex
	issued         map[string]bool
}

func (ts *tokenService) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/token" {
			u, p, ok := req.BasicAuth()
			if !ok || u != ts.user || p != ts.password {
				// Echo what was sent, as a careless token service might.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials %s:%s"}]}`, u, p)
				return
			}
			ts.mu.Lock()
			tok := fmt.Sprintf("issued-%d-%s", len(ts.issued), req.URL.Query().Get("scope"))
			if ts.issued == nil {
				ts.issued = map[string]bool{}
			}
			ts.issued[tok] = true
			ts.mu.Unlock()
			_ = json.NewEncoder(w).Encode(map[string]string{"token": tok})
			return
		}
		tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		ts.mu.Lock()
		good := ok && ts.issued[tok]
		ts.mu.Unlock()
		if !good {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+req.Host+`/token",service="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, req)
	})
}

func TestBasicCredentialsAtATokenService(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "a token-authenticated registry's token service echoes the credentials it was sent into its error",
		"the credentials are exchanged for a token; wrong ones fail with a reason naming the refusal, without the password")
	ctx := context.Background()
	ts := &tokenService{user: "bob", password: "s3cret-token-pw"}
	r := newRegistry(t, ts.wrap)
	ref := r.push(t, "private/app:1", image(t, hostPlatform(), v1.Config{}, layer(t, file("a", "a", 0o644))))

	opts := private
	_, err := oci.Fetch(ctx, ref, target(t), opts)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "needs credentials") {
		t.Errorf("anonymous: %v", err)
	}
	const wrong = "wrong-pw-777"
	opts.Credentials = oci.Credentials{Username: "bob", Password: wrong}
	_, err = oci.Fetch(ctx, ref, target(t), opts)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "refused the credentials") {
		t.Errorf("wrong password: %v (%q)", err, errdefs.Message(err, ""))
	}
	if err != nil && strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, err), wrong) {
		t.Errorf("the error shows the password: %v", err)
	}

	opts.Credentials.Password = ts.password
	dst := target(t)
	if _, err := oci.Fetch(ctx, ref, dst, opts); err != nil {
		t.Fatalf("with the right password: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a")); string(b) != "a" {
		t.Error("the image is not unpacked")
	}
}

// cdn stands for the blob store a registry redirects blob reads to (a
// CDN on another host, here another port of loopback, the case Go's own
// redirect rule would forward an Authorization header to): it serves the
// registry's blobs without authentication and records every
// Authorization header it is sent.
type cdn struct {
	srv  *httptest.Server
	mu   sync.Mutex
	auth []string
	hits int
}

// newCDN serves what the registry at host serves, read past its auth
// with the test's push header.
func newCDN(t *testing.T, host string) *cdn {
	c := &cdn{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c.mu.Lock()
		c.hits++
		if a := req.Header.Get("Authorization"); a != "" {
			c.auth = append(c.auth, a)
		}
		c.mu.Unlock()
		out, err := http.NewRequestWithContext(req.Context(), req.Method, "http://"+host+req.URL.Path, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out.Header.Set("X-Test-Push", "1")
		res, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// redirectBlobs sends blob reads that got past auth to c, as registries
// backed by an object store do (307 to a signed URL).
func redirectBlobs(c **cdn) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
				http.Redirect(w, req, (*c).srv.URL+req.URL.Path, http.StatusTemporaryRedirect)
				return
			}
			h.ServeHTTP(w, req)
		})
	}
}

func TestCredentialsNeverSentToARedirect(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "a registry redirects blob reads to another host (a CDN, or an attacker's)",
		"the blobs are read from there without the registry's credentials or token: no Authorization header reaches the other host")
	for _, kind := range []string{"basic", "token"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			var c *cdn
			var authz func(http.Handler) http.Handler
			if kind == "basic" {
				authz = basicAuth("carol", "pw-redirect-1")
			} else {
				authz = (&tokenService{user: "carol", password: "pw-redirect-1"}).wrap
			}
			r := newRegistry(t, func(h http.Handler) http.Handler { return authz(redirectBlobs(&c)(h)) })
			c = newCDN(t, r.host)
			ref := r.push(t, "private/app:1", image(t, hostPlatform(), v1.Config{Env: []string{"A=1"}}, layer(t, file("a", "a", 0o644))))

			opts := private
			opts.Credentials = oci.Credentials{Username: "carol", Password: "pw-redirect-1"}
			dst := target(t)
			img, err := oci.Fetch(ctx, ref, dst, opts)
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			if len(img.Config.Env) != 1 {
				t.Errorf("config: %+v", img.Config)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.hits < 2 {
				t.Fatalf("the CDN got %d requests: the test does not redirect", c.hits)
			}
			if len(c.auth) > 0 {
				t.Errorf("the redirect host got Authorization headers: %q", c.auth)
			}
		})
	}
}
