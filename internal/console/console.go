// Package console serves sandboxd's web console at /console/: static files
// (HTML, CSS and a small JavaScript app, no build step) embedded in the
// binary. The app runs in the browser and uses sandboxd's own API with the
// account key the user signs in with, which it keeps in the tab's
// sessionStorage only. The server side holds no session and no
// credential: every request the app makes is authenticated by the API like
// any client's, so the console can do nothing the key could not.
//
// Every answer carries a strict Content-Security-Policy: scripts and styles
// from these files only (no inline code, no eval), connections to this
// origin only, images and previews from this origin or from blobs the app
// made, and no framing by any page.
package console

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"
)

// Path is where the console is served.
const Path = "/console"

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every answer. blob: is allowed
// for images and frames because file previews are blobs the app made
// from the API's answers (an image shown in <img> runs no script, an SVG
// included); connect-src 'self' covers the API, its event streams and the
// terminal's websocket.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; " +
	"frame-src blob:; object-src 'none'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console under Path.
func Handler() (http.Handler, error) {
	files, err := fs.Sub(static, "static")
	if err != nil {
		return nil, fmt.Errorf("console files: %w", err)
	}
	fileServer := http.StripPrefix(Path+"/", http.FileServer(http.FS(files)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		// The files are small and change with the binary, which sets no
		// modification time on them: always ask again.
		h.Set("Cache-Control", "no-cache")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		default:
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == Path {
			http.Redirect(w, r, Path+"/", http.StatusMovedPermanently)
			return
		}
		fileServer.ServeHTTP(w, r)
	}), nil
}

// Mounts are the console's routes for the server's router (internal/router).
func Mounts() (map[string]http.Handler, error) {
	h, err := Handler()
	if err != nil {
		return nil, err
	}
	return map[string]http.Handler{Path: h, Path + "/*": h}, nil
}
