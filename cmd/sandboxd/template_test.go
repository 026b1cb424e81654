package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// templateAPI answers the template routes as the contract does: alice's
// py:latest (which builds in three polls, or fails), a public py:latest
// and a public base:1, and a failed tools:latest.
type templateAPI struct {
	mu       sync.Mutex
	polls    int  // GETs of tpl_py so far
	fail     bool // tpl_py's build fails
	requests []string
}

func tplJSON(id, name, tag, status string, public bool, extra string) string {
	return fmt.Sprintf(`{"id":%q,"name":%q,"tag":%q,"status":%q,"public":%t,"source":"registry.example/%s","digest":null,"config":null,"failureReason":null%s,"createdAt":"2026-01-02T03:04:05Z","updatedAt":"2026-01-02T03:04:05Z"}`,
		id, name, tag, status, public, name, extra)
}

func (a *templateAPI) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, code int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
	list := `{"status":"success","templates":[` +
		tplJSON("tpl_py", "py", "latest", "building", false, "") + "," +
		tplJSON("tpl_tools", "tools", "latest", "failed", false, "") + "," +
		tplJSON("tpl_base", "base", "1", "ready", true, "") + "," +
		tplJSON("tpl_pubpy", "py", "latest", "ready", true, "") + `]}`
	mux.HandleFunc("GET /api/templates", func(w http.ResponseWriter, r *http.Request) { answer(w, 200, list) })
	mux.HandleFunc("POST /api/templates", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Name, Image, Dockerfile, FromTemplate string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name != "py" || (req.Image != "registry.example/library/python:3.12") == (req.Dockerfile == "" && req.FromTemplate == "") {
			answer(w, 400, `{"status":"error","error":"bad request"}`)
			return
		}
		answer(w, 202, `{"status":"success","template":`+tplJSON("tpl_py", "py", "latest", "building", false, "")+`}`)
	})
	mux.HandleFunc("GET /api/templates/tpl_py", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.polls++
		n, fail := a.polls, a.fail
		a.mu.Unlock()
		lines := []string{"resolving registry.example/library/python:3.12\n", "layer 1/2 applied\n", "layer 2/2 applied\n"}
		status, extra := "building", ""
		if n >= 3 {
			n = 3
			if fail {
				status, extra = "failed", `,"failureReason":"layer 2: too large"`
			} else {
				status = "ready"
			}
		}
		log, _ := json.Marshal(strings.Join(lines[:n], ""))
		body := tplJSON("tpl_py", "py", "latest", status, false, `,"log":`+string(log))
		if extra != "" {
			body = strings.Replace(body, `"failureReason":null`, extra[1:], 1)
		}
		answer(w, 200, `{"status":"success","template":`+body+`}`)
	})
	mux.HandleFunc("GET /api/templates/tpl_pubpy", func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, `{"status":"success","template":`+tplJSON("tpl_pubpy", "py", "latest", "ready", true, `,"log":"public\n"`)+`}`)
	})
	mux.HandleFunc("DELETE /api/templates/tpl_tools", func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, `{"status":"success","template":`+tplJSON("tpl_tools", "tools", "latest", "failed", false, "")+`}`)
	})
	mux.HandleFunc("DELETE /api/templates/tpl_base", func(w http.ResponseWriter, r *http.Request) {
		answer(w, 403, `{"status":"error","error":"Public templates cannot be deleted"}`)
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_1/template", func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, `{"status":"success","template":`+tplJSON("tpl_saved", "saved", "v1", "ready", false, `,"log":"saved\n"`)+`}`)
	})
	mux.HandleFunc("POST /api/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, `{"status":"success","sandboxes":[{"sandboxId":"sbx_1","sandboxStatus":"running","timeout":1000,"createdAt":"2026-01-02T03:04:05Z"}]}`)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.requests = append(a.requests, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
		a.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		mux.ServeHTTP(w, r)
	})
}

func (a *templateAPI) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[len(a.requests)-1]
}

func newTemplateAPI(t *testing.T) *templateAPI {
	a := &templateAPI{}
	srv := httptest.NewServer(a.handler(t))
	t.Cleanup(srv.Close)
	for _, k := range []string{"SANDBOXD_JSON", "SANDBOXD_ACCOUNT"} {
		t.Setenv(k, "")
	}
	t.Setenv("SANDBOXD_URL", srv.URL)
	t.Setenv("SANDBOXD_API_KEY", "sbx_k")
	old := templatePoll
	templatePoll = time.Millisecond
	t.Cleanup(func() { templatePoll = old })
	return a
}

// TestTemplateBuildWait: build --wait posts the build, then prints each
// new line of the log once, on stderr, and the ready template on stdout;
// a build that fails exits non-zero with its reason.
func TestTemplateBuildWait(t *testing.T) {
	a := newTemplateAPI(t)
	out, errOut, _, err := runRoot(t, "template", "build", "py", "--image", "registry.example/library/python:3.12", "--wait")
	if err != nil {
		t.Fatalf("build --wait: %v\n%s", err, errOut)
	}
	wantLog := "resolving registry.example/library/python:3.12\nlayer 1/2 applied\nlayer 2/2 applied\n"
	if !strings.HasSuffix(errOut, wantLog) || strings.Count(errOut, "layer 1/2") != 1 {
		t.Errorf("stderr:\n%s\nwant the log once, ending with\n%s", errOut, wantLog)
	}
	if !strings.Contains(out, "tpl_py") || !strings.Contains(out, "ready") || strings.Contains(out, "applied") {
		t.Errorf("stdout:\n%s", out)
	}
	a.mu.Lock()
	first := a.requests[0]
	a.mu.Unlock()
	if got := first; got != `POST /api/templates {"name":"py","image":"registry.example/library/python:3.12"}` {
		t.Errorf("build sent %q", got)
	}

	a = newTemplateAPI(t)
	a.mu.Lock()
	a.fail = true
	a.mu.Unlock()
	out, errOut, cmd, err := runRoot(t, "template", "build", "py", "--image", "registry.example/library/python:3.12", "--wait", "--json")
	if err == nil || !strings.Contains(err.Error(), "failed to build: layer 2: too large") || !wantsJSON(cmd) || out != "" {
		t.Errorf("failed build: %v, stdout %q, stderr %q", err, out, errOut)
	}

	// Without --wait: the template as the server answered, building.
	out, _, _, err = runRoot(t, "template", "build", "py", "--image", "registry.example/library/python:3.12", "--json")
	var got struct{ ID, Status string }
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.ID != "tpl_py" || got.Status != "building" {
		t.Errorf("build --json: %v %q", err, out)
	}
	if _, _, _, err := runRoot(t, "template", "build", "py"); err == nil || !strings.Contains(err.Error(), "--image") {
		t.Errorf("build without --image: %v", err)
	}
}

// TestTemplateBuildStepsAndDockerfile: --steps and --dockerfile read
// their files into the build's body, with the start and ready commands;
// a Dockerfile goes without --image.
func TestTemplateBuildStepsAndDockerfile(t *testing.T) {
	a := newTemplateAPI(t)
	dir := t.TempDir()
	steps := filepath.Join(dir, "steps.json")
	os.WriteFile(steps, []byte(`[{"type":"RUN","args":["make"]},{"type":"ENV","args":["X","1"],"force":true}]`), 0o644)
	if _, errOut, _, err := runRoot(t, "template", "build", "py", "--image", "registry.example/library/python:3.12", "--steps", steps, "--start-cmd", "serve", "--ready-cmd", "check", "--json"); err != nil {
		t.Fatalf("build --steps: %v\n%s", err, errOut)
	}
	if got := a.last(); got != `POST /api/templates {"name":"py","image":"registry.example/library/python:3.12","steps":[{"type":"RUN","args":["make"]},{"type":"ENV","args":["X","1"],"force":true}],"startCmd":"serve","readyCmd":"check"}` {
		t.Errorf("build --steps sent %q", got)
	}
	df := filepath.Join(dir, "Dockerfile")
	os.WriteFile(df, []byte("FROM registry.example/base\nRUN make\n"), 0o644)
	if _, errOut, _, err := runRoot(t, "template", "build", "py", "--dockerfile", df, "--json"); err != nil {
		t.Fatalf("build --dockerfile: %v\n%s", err, errOut)
	}
	if got := a.last(); got != `POST /api/templates {"name":"py","dockerfile":"FROM registry.example/base\nRUN make\n"}` {
		t.Errorf("build --dockerfile sent %q", got)
	}
	if _, _, _, err := runRoot(t, "template", "build", "py", "--dockerfile", df, "--image", "x"); err == nil || !strings.Contains(err.Error(), "its FROM is the image") {
		t.Errorf("--dockerfile with --image: %v", err)
	}
	if _, _, _, err := runRoot(t, "template", "build", "py", "--image", "x", "--steps", df); err == nil || !strings.Contains(err.Error(), "--steps: not a JSON array") {
		t.Errorf("--steps of a Dockerfile: %v", err)
	}
}

// TestTemplateResolve: a name resolves to the account's own template
// before a public one of the same name and tag, a tag defaults to latest,
// an id is taken as it is, and an unknown name is the API's 404.
func TestTemplateResolve(t *testing.T) {
	a := newTemplateAPI(t)
	for _, c := range []struct{ ref, get string }{
		{"py", "GET /api/templates/tpl_py"},
		{"py:latest", "GET /api/templates/tpl_py"},
		{"tpl_pubpy", "GET /api/templates/tpl_pubpy"},
	} {
		if _, _, _, err := runRoot(t, "template", "inspect", c.ref); err != nil || a.last() != c.get {
			t.Errorf("inspect %s: %v, asked %q, want %q", c.ref, err, a.last(), c.get)
		}
	}
	_, errOut, cmd, err := runRoot(t, "template", "inspect", "nothere:1", "--json")
	if err == nil || !wantsJSON(cmd) {
		t.Fatalf("unknown: %v", err)
	}
	var sb strings.Builder
	reportError(&sb, err, true)
	if sb.String() != `{"error":"Template nothere:1 not found","status":404}`+"\n" {
		t.Errorf("unknown: %s %s", sb.String(), errOut)
	}
}

// TestTemplateCommands: ls, inspect (the log aside), logs, rm, and
// sandbox create --template as the API receives it.
func TestTemplateCommands(t *testing.T) {
	a := newTemplateAPI(t)
	out, _, _, err := runRoot(t, "template", "ls")
	if err != nil || !strings.HasPrefix(out, "ID") || strings.Count(out, "\n") != 5 || !strings.Contains(out, "py:latest     building  false") {
		t.Errorf("ls: %v\n%s", err, out)
	}
	out, _, _, err = runRoot(t, "template", "ls", "--json")
	var list []struct{ ID string }
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 4 {
		t.Errorf("ls --json: %v %s", err, out)
	}

	out, _, _, err = runRoot(t, "template", "inspect", "tpl_pubpy")
	if err != nil || !strings.Contains(out, "public") || strings.Contains(out, "log") {
		t.Errorf("inspect: %v\n%s", err, out)
	}
	out, _, _, err = runRoot(t, "template", "inspect", "--json", "tpl_pubpy")
	if err != nil || !strings.Contains(out, `"log": "public\n"`) {
		t.Errorf("inspect --json: %v\n%s", err, out)
	}

	out, _, _, err = runRoot(t, "template", "logs", "--follow", "py")
	if err != nil || out != "resolving registry.example/library/python:3.12\nlayer 1/2 applied\nlayer 2/2 applied\n" {
		t.Errorf("logs --follow: %v %q", err, out)
	}
	out, _, _, err = runRoot(t, "template", "logs", "py", "--json")
	var logs struct{ Status, Log string }
	if err != nil || json.Unmarshal([]byte(out), &logs) != nil || logs.Status != "ready" || !strings.Contains(logs.Log, "layer 2/2") {
		t.Errorf("logs --json: %v %s", err, out)
	}

	out, errOut, _, err := runRoot(t, "template", "rm", "tools", "base:1")
	if out != "tpl_tools\n" || !strings.Contains(errOut, "rm base:1: HTTP 403: Public templates cannot be deleted") {
		t.Errorf("rm: %v %q %q", err, out, errOut)
	}
	if e, ok := err.(*exitError); !ok || e.code != 1 {
		t.Errorf("rm with a failure: %v", err)
	}

	if _, _, _, err := runRoot(t, "sandbox", "create", "--template", "py:3.12"); err != nil || a.last() != `POST /api/sandboxes {"template":"py:3.12"}` {
		t.Errorf("create --template: %v %q", err, a.last())
	}
	// SANDBOXD_TEMPLATE is serve's image: a create does not read it.
	t.Setenv("SANDBOXD_TEMPLATE", "full")
	if _, _, _, err := runRoot(t, "sandbox", "create"); err != nil || a.last() != `POST /api/sandboxes {}` {
		t.Errorf("create with SANDBOXD_TEMPLATE set: %v %q", err, a.last())
	}
}

// TestNewLog: the new part of a build's log, also once the server's window
// of its last 64 KiB has moved past the start.
func TestNewLog(t *testing.T) {
	for _, c := range []struct{ prev, cur, want string }{
		{"", "a\n", "a\n"},
		{"a\n", "a\nb\n", "b\n"},
		{"a\nb\n", "a\nb\n", ""},
		{"a\nb\n", "b\nc\n", "c\n"},    // a went out of the window
		{"a\nb\n", "x\ny\n", "x\ny\n"}, // all of prev went
	} {
		if got := newLog(c.prev, c.cur); got != c.want {
			t.Errorf("newLog(%q, %q) = %q, want %q", c.prev, c.cur, got, c.want)
		}
	}
}

// TestCompleteTemplates: template names complete from the list, the
// account's own hiding a public one of the same name, and only ready ones
// for create --template.
func TestCompleteTemplates(t *testing.T) {
	newTemplateAPI(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"template", "rm", ""}, "py:latest\tbuilding\ntools:latest\tfailed\nbase:1\tready, public\n:4\n"},
		{[]string{"template", "inspect", "b"}, "base:1\tready, public\n:4\n"},
		{[]string{"sandbox", "create", "--template", ""}, "base:1\tready, public\n:4\n"},
	} {
		out, _, _, err := runRoot(t, append([]string{cobra.ShellCompRequestCmd}, c.args...)...)
		if got, _, _ := strings.Cut(out, "Completion ended"); err != nil || got != c.want {
			t.Errorf("complete %q: %v %q, want %q", c.args, err, out, c.want)
		}
	}
}

// TestTemplateBuildOverAndFromSandbox: --from-template sends the parent
// with the steps; --from-sandbox saves the sandbox through its route and
// prints the ready template; either with what it cannot take is refused
// before a request.
func TestTemplateBuildOverAndFromSandbox(t *testing.T) {
	a := newTemplateAPI(t)
	dir := t.TempDir()
	steps := filepath.Join(dir, "steps.json")
	os.WriteFile(steps, []byte(`[{"type":"RUN","args":["make"]}]`), 0o644)
	if _, errOut, _, err := runRoot(t, "template", "build", "py", "--from-template", "base:1", "--steps", steps, "--json"); err != nil {
		t.Fatalf("build --from-template: %v\n%s", err, errOut)
	}
	if got := a.last(); got != `POST /api/templates {"name":"py","steps":[{"type":"RUN","args":["make"]}],"fromTemplate":"base:1"}` {
		t.Errorf("build --from-template sent %q", got)
	}
	out, errOut, _, err := runRoot(t, "template", "build", "saved:v1", "--from-sandbox", "sbx_1", "--json")
	var got struct{ ID, Status string }
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.ID != "tpl_saved" || got.Status != "ready" || strings.Contains(out, `"log"`) {
		t.Fatalf("build --from-sandbox: %v %q %s", err, out, errOut)
	}
	if got := a.last(); got != `POST /api/sandboxes/sbx_1/template {"name":"saved:v1"}` {
		t.Errorf("build --from-sandbox sent %q", got)
	}
	n := len(a.requests)
	for _, args := range [][]string{
		{"--from-sandbox", "sbx_1", "--steps", steps},
		{"--from-sandbox", "sbx_1", "--from-template", "base:1"},
		{"--from-template", "base:1", "--image", "x"},
		{"--from-template", "base:1", "--dockerfile", steps},
	} {
		if _, _, _, err := runRoot(t, append([]string{"template", "build", "py"}, args...)...); err == nil {
			t.Errorf("build %v: no error", args)
		}
	}
	if len(a.requests) != n {
		t.Errorf("refused flags sent %v", a.requests[n:])
	}
}
