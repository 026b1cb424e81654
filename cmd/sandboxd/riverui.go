package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/jobs"
)

// riverUIPath is where River's UI is served, for operators.
const riverUIPath = "/riverui"

// minAdminKeyBytes is the shortest operator key: it guards every account's
// jobs, so it must not be guessable (e.g. openssl rand -hex 32).
const minAdminKeyBytes = 32

// loadAdminKey reads the operator's key from path (surrounding whitespace
// dropped).
func loadAdminKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read --admin-key-file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minAdminKeyBytes {
		return nil, fmt.Errorf("admin key in %s: %d bytes, want at least %d (e.g. openssl rand -hex 32)", path, len(b), minAdminKeyBytes)
	}
	return b, nil
}

// riverUIMounts are the routes of River's UI behind the operator's key
// (loadAdminKey), or none when serve has no --admin-key-file: no operator
// page is served without a credential of its own (account keys never open
// it).
func riverUIMounts(ctx context.Context, jc *jobs.Client, key []byte, log *slog.Logger) (map[string]http.Handler, error) {
	if key == nil {
		return nil, nil
	}
	ui, err := jc.UI(ctx, riverUIPath, log)
	if err != nil {
		return nil, err
	}
	h := adminOnly(key, ui)
	return map[string]http.Handler{riverUIPath: h, riverUIPath + "/*": h}, nil
}

// adminOnly serves h to requests that carry the operator's key as the
// password of HTTP Basic authentication (any user name): a browser asks
// for it once and sends it with every request of the page, which a single
// page app's own fetches cannot otherwise be made to carry. Since a
// browser sends those credentials to cross-site requests too, a request
// that changes something must come from this origin (CSRF). The cluster
// listener, which serves signed forwards only, never serves it.
func adminOnly(key []byte, h http.Handler) http.Handler {
	want := sha256.Sum256(key)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if edge.ViaCluster(r) {
			http.NotFound(w, r)
			return
		}
		_, pass, ok := r.BasicAuth()
		got := sha256.Sum256([]byte(pass))
		if !ok || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="sandboxd operators", charset="UTF-8"`)
			http.Error(w, "the operator's key (serve --admin-key-file) is needed here", http.StatusUnauthorized)
			return
		}
		if !sameOrigin(r) {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// sameOrigin says whether r may act: reads always may; a request with any
// other method must not come from another site, by the headers browsers
// send (Sec-Fetch-Site, Origin). A client that sends neither is not a
// browser, and has no ambient credential to be tricked into using.
func sameOrigin(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}
