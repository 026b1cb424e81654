package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T, method, target string) *http.Response {
	t.Helper()
	h, err := Handler()
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec.Result()
}

// TestServes: the page and its files come with their types and the
// security headers; /console redirects to /console/.
func TestServes(t *testing.T) {
	for path, typ := range map[string]string{
		"/console/":            "text/html",
		"/console/app.js":      "text/javascript",
		"/console/style.css":   "text/css",
		"/console/favicon.svg": "image/svg+xml",
	} {
		resp := serve(t, "GET", path)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), typ) || len(body) == 0 {
			t.Errorf("%s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != CSP {
			t.Errorf("%s: CSP %q", path, got)
		}
		for k, v := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
			if resp.Header.Get(k) != v {
				t.Errorf("%s: %s %q", path, k, resp.Header.Get(k))
			}
		}
	}
	resp := serve(t, "GET", "/console")
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/console/" {
		t.Errorf("/console: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := serve(t, "GET", "/console/nope.js"); resp.StatusCode != 404 {
		t.Errorf("missing file: %d", resp.StatusCode)
	}
	if resp := serve(t, "POST", "/console/"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}

// TestCSPIsStrict: no inline code is allowed, and nothing may frame the
// console.
func TestCSPIsStrict(t *testing.T) {
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "*", "data:", "http:", "https:"} {
		if strings.Contains(CSP, bad) {
			t.Errorf("CSP allows %q: %s", bad, CSP)
		}
	}
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"} {
		if !strings.Contains(CSP, want) {
			t.Errorf("CSP lacks %q", want)
		}
	}
}

// TestFilesKeepTheRules reads the shipped files for what the CSP would
// refuse at run time (inline scripts, handlers and styles) and for what
// the app must never do: parse data as HTML, evaluate strings, or keep the
// key beyond the tab's session.
func TestFilesKeepTheRules(t *testing.T) {
	read := func(name string) string {
		b, err := fs.ReadFile(static, "static/"+name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	html := read("index.html")
	for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1) {
		if !strings.Contains(m, `src="`) {
			t.Errorf("inline script: %s", m)
		}
	}
	if regexp.MustCompile(`<script[^>]*src="[^"]*"[^>]*>[^<]+</script>`).MatchString(html) {
		t.Error("a script element with both src and content")
	}
	if m := regexp.MustCompile(`\son[a-z]+=|\sstyle=|javascript:`).FindString(html); m != "" {
		t.Errorf("index.html has %q (inline handler or style)", m)
	}
	js := read("app.js")
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage.", "localStorage[", "document.cookie", "setTimeout('", `setTimeout("`} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
	if !strings.Contains(js, "sessionStorage") || !strings.Contains(js, "'sandboxd.key.' + state.key") {
		t.Error("app.js no longer keeps the key in sessionStorage, or no longer sends it as the websocket subprotocol")
	}
}

// TestPageHasWhatTheAppUses: every element the app looks up by id is in
// the page, once.
func TestPageHasWhatTheAppUses(t *testing.T) {
	html, err := fs.ReadFile(static, "static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	js, err := fs.ReadFile(static, "static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, m := range regexp.MustCompile(`\sid="([^"]+)"`).FindAllStringSubmatch(string(html), -1) {
		ids[m[1]]++
	}
	// $(id), and the helpers that take an element's id first.
	used := regexp.MustCompile(`(?:\$|say|busy|act|minutesField|policyOf)\('([a-z0-9-]+)'[,)]`).FindAllStringSubmatch(string(js), -1)
	if len(used) < 50 {
		t.Fatalf("found %d lookups in app.js: is $(id) still how it finds elements?", len(used))
	}
	for _, m := range used {
		if n := ids[m[1]]; n != 1 {
			t.Errorf("app.js uses #%s, which index.html has %d times", m[1], n)
		}
	}
}

// TestNavLinksHaveViews: every link of the navigation (Volumes among
// them) opens a view the page has and the app's router loads.
func TestNavLinksHaveViews(t *testing.T) {
	html, err := fs.ReadFile(static, "static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	js, err := fs.ReadFile(static, "static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	links := regexp.MustCompile(`<a href="#([a-z]+)" data-view="([a-z]+)">`).FindAllStringSubmatch(string(html), -1)
	if len(links) < 7 {
		t.Fatalf("found %d navigation links: is the nav still <a href=\"#view\" data-view=\"view\">?", len(links))
	}
	var names []string
	for _, m := range links {
		name := m[2]
		names = append(names, name)
		if m[1] != name {
			t.Errorf("the link to #%s says data-view %q", m[1], name)
		}
		if !strings.Contains(string(html), `<section id="view-`+name+`" class="view"`) {
			t.Errorf("no section view-%s for its link", name)
		}
		if !regexp.MustCompile(`\n    ` + name + `: \{ load: `).Match(js) {
			t.Errorf("the app's views have no %s", name)
		}
	}
	if !strings.Contains(strings.Join(names, ","), "templates,volumes") {
		t.Errorf("navigation %v: no Volumes after Templates", names)
	}
}
