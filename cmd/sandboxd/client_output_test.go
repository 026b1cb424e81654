package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files of TestClientOutput")

// TestClientOutput runs each `sandboxd sandbox` command against canned API
// answers and compares what it prints, and the request it sent, with golden
// files: scripts read the CLI's output, so it must not change by accident.
func TestClientOutput(t *testing.T) {
	for _, k := range []string{"SANDBOXD_URL", "SANDBOXD_API_KEY", "SANDBOXD_JSON", "SANDBOXD_ACCOUNT"} {
		t.Setenv(k, "")
	}
	const sb = `{"sandboxId":"sbx_1","sandboxStatus":"running","timeout":599500,"createdAt":"2026-01-02T03:04:05Z","runId":"run_1","runtime":"gvisor"}`
	const stopped = `{"sandboxId":"sbx_1","sandboxStatus":"stopped","timeout":0,"createdAt":"2026-01-02T03:04:05Z","runtime":"gvisor"}`
	var (
		mu   sync.Mutex
		last string // method, path and body of the last request
	)
	mux := http.NewServeMux()
	answer := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		}
	}
	mux.HandleFunc("POST /api/sandboxes", answer(`{"status":"success","sandboxes":[`+sb+`]}`))
	listed := answer(`{"status":"success","sandboxes":[` + sb + `,` + stopped + `],"snapshot_id":"snap_1","github_repo":null,"filetree":[{"path":"a.txt","type":"blob"}],"filetree_truncated":true}`)
	// A failed sandbox with a field this CLI's client does not know.
	const failed = `{"sandboxId":"sbx_9","sandboxStatus":"failed","timeout":0,"createdAt":"2026-01-02T03:04:05Z","runtime":"gvisor","failureReason":"the runtime could not start it","network":"none"}`
	mux.HandleFunc("GET /api/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		// Paged (ls --all): two pages, the first naming the second.
		switch q := r.URL.Query(); {
		case q.Get("sandbox_id") == "sbx_9":
			answer(`{"status":"success","sandboxes":[`+failed+`],"snapshot_id":null,"github_repo":null,"filetree":null}`)(w, r)
		case q.Get("sandbox_id") == "sbx_none":
			answer(`{"status":"success","sandboxes":[],"snapshot_id":null,"github_repo":null,"filetree":null}`)(w, r)
		case !q.Has("limit"):
			listed(w, r)
		case q.Get("cursor") == "":
			w.Header().Set("X-Next-Cursor", "page2")
			answer(`{"status":"success","sandboxes":[`+sb+`],"snapshot_id":"snap_1","github_repo":null,"filetree":null}`)(w, r)
		default:
			answer(`{"status":"success","sandboxes":[`+stopped+`],"snapshot_id":"snap_1","github_repo":null,"filetree":null}`)(w, r)
		}
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_1/stop", answer(`{"status":"success","sandbox":`+stopped+`}`))
	mux.HandleFunc("POST /api/sandboxes/sbx_1/exec", func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: stdout\ndata: {\"data\":\"out\\n\"}\n\n")
			io.WriteString(w, "event: stderr\ndata: {\"data\":\"err\\n\"}\n\n")
			io.WriteString(w, "event: exit\ndata: {\"durationMs\":12,\"exitCode\":3}\n\n")
			return
		}
		answer(`{"status":"success","exitCode":3,"stdout":"out\n","stderr":"err\n","durationMs":12}`)(w, r)
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_gone/stop", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"status":"error","error":"Sandbox not found"}`)
	})
	// A sandbox with every field: a network policy, its traffic, a parent.
	const full = `{"sandboxId":"sbx_2","sandboxStatus":"running","timeout":60000,"createdAt":"2026-01-02T03:04:05.000Z","runtime":"gvisor","network":{"allow":["192.0.2.1","example.com"]},"network_bytes":{"sent":10,"received":20},"forkedFrom":"sbx_1"}`
	mux.HandleFunc("POST /api/sandboxes/sbx_1/fork", answer(`{"status":"success","sandboxes":[`+full+`,`+full+`]}`))
	mux.HandleFunc("POST /api/sandboxes/sbx_1/pause", answer(`{"status":"success","sandbox":`+strings.Replace(sb, `"running"`, `"paused"`, 1)+`}`))
	mux.HandleFunc("POST /api/sandboxes/sbx_1/resume", answer(`{"status":"success","sandbox":`+sb+`}`))
	mux.HandleFunc("PATCH /api/sandboxes/sbx_2/network", answer(`{"status":"success","sandbox":`+full+`}`))
	mux.HandleFunc("GET /api/sandboxes/sbx_1/processes", answer(`{"status":"success","processes":[{"pid":7,"tag":"run_1","command":["sh","-c","sleep 9"],"cwd":"/workspace","pty":false,"startedAt":"2026-01-02T03:04:06.000Z"},{"pid":12,"command":["bash","-l"],"pty":true,"startedAt":"2026-01-02T03:04:07.000Z"}]}`))
	mux.HandleFunc("DELETE /api/sandboxes/sbx_1/processes/7", answer(`{"status":"success"}`))
	mux.HandleFunc("DELETE /api/sandboxes/sbx_1/processes/8", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"status":"error","error":"signal must be one of SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT","missing_fields":["signal"]}`)
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_busy/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"status":"error","error":"Sandbox is not running"}`)
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_oom/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: stdout\ndata: {\"data\":\"partial\"}\n\n")
		io.WriteString(w, "event: exit\ndata: {\"durationMs\":5,\"exitCode\":137,\"oomKilled\":true}\n\n")
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_fail/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: error\ndata: {\"error\":\"command not found\",\"statusCode\":400}\n\n")
	})
	mux.HandleFunc("GET /api/sandboxes/sbx_html/processes", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>bad gateway</html>")
	})
	mux.HandleFunc("POST /api/sandboxes/sbx_slow/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: exit\ndata: {\"durationMs\":2000,\"exitCode\":137,\"timedOut\":true}\n\n")
	})
	// A run's log in events that cut a line in two, then its end.
	mux.HandleFunc("GET /api/tasks/runs/run_1/log", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: log\ndata: {\"data\":\"[stdout] hel\"}\n\n")
		io.WriteString(w, "event: log\ndata: {\"data\":\"lo\\n[stderr] warning\\n[sandboxd] committed\\n\"}\n\n")
		io.WriteString(w, "event: end\ndata: {\"status\":\"COMPLETED\"}\n\n")
	})
	mux.HandleFunc("GET /api/tasks/runs", answer(`{"status":"success","runs":[{"id":"run_1","taskIdentifier":"run-sandbox-command","status":"COMPLETED","isCompleted":true,"isSuccess":true,"isFailed":false,"createdAt":"2026-01-02T03:04:05.000Z","updatedAt":"2026-01-02T03:04:06.000Z","startedAt":null,"finishedAt":null,"durationMs":1000,"tags":[],"payload":{},"output":{"stdout":"hello\n","stderr":"warning\n","exitCode":3},"error":null,"sandboxId":"sbx_1"}]}`))
	mux.HandleFunc("DELETE /api/sandboxes/sbx_1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"status":"error","error":"Sandbox is running: stop it before deleting it"}`)
	})
	mux.HandleFunc("DELETE /api/sandboxes/sbx_3", answer(`{"status":"success","sandbox":`+strings.Replace(stopped, "sbx_1", "sbx_3", 1)+`}`))
	mux.HandleFunc("POST /api/sandboxes/sbx_1/timeout", answer(`{"status":"success","sandbox":`+strings.Replace(sb, "599500", "3600000", 1)+`}`))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = r.Method + " " + r.URL.RequestURI() + "\n" + canonicalJSON(t, body)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		mux.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// The input of the cases that have one (the others' is the test's,
	// /dev/null, which exec does not send).
	stdins := map[string]string{"exec-stdin-keep-running": "kept\n", "exec-keep-running-pipe": "not sent\n"}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"create", []string{"create", "--timeout", "90s", "--cwd", "/w", "--", "sh", "-c", "true"}},
		{"create-json", []string{"create", "--json", "--account", "acct", "--prompt", "hi"}},
		{"create-noargs", []string{"create", "--", "true"}},
		{"ls", []string{"ls"}},
		{"ls-json", []string{"ls", "--json", "--account", "acct"}},
		{"ls-all", []string{"ls", "--all"}},
		{"ls-all-json", []string{"ls", "--all", "--json", "--account", "acct"}},
		{"exec", []string{"exec", "sbx_1", "--cwd", "/w", "--", "sh", "-c", "x"}},
		{"exec-json", []string{"exec", "--json", "sbx_1", "--", "true"}},
		{"stop", []string{"stop", "sbx_1"}},
		{"stop-json", []string{"stop", "--json", "--account", "acct", "sbx_1"}},
		{"stop-error", []string{"stop", "sbx_gone"}},
		{"create-network", []string{"create", "--network", "allow=192.0.2.1, example.com", "--account", "acct"}},
		{"create-egress", []string{"create", "--network", "egress", "--", "sh"}},
		{"exec-args-json", []string{"exec", "--json", "--account", "acct", "sbx_1", "--", "ls", "-l", "/"}},
		{"exec-conflict", []string{"exec", "sbx_busy", "--", "true"}},
		{"exec-oom", []string{"exec", "sbx_oom", "--", "big"}},
		{"exec-error", []string{"exec", "sbx_fail", "--", "nothere"}},
		{"fork", []string{"fork", "sbx_1", "--count", "2", "--timeout", "1m"}},
		{"fork-json", []string{"fork", "--json", "sbx_1"}},
		{"pause", []string{"pause", "sbx_1"}},
		{"resume-json", []string{"resume", "--json", "--account", "acct", "sbx_1"}},
		{"network", []string{"network", "sbx_2", "allow=192.0.2.1,example.com"}},
		{"network-json", []string{"network", "--json", "sbx_2", `{"allow":["192.0.2.1","example.com"]}`}},
		{"network-none", []string{"network", "--account", "acct", "sbx_2", "none"}},
		{"ps", []string{"ps", "sbx_1"}},
		{"ps-json", []string{"ps", "--json", "--account", "acct", "sbx_1"}},
		{"ps-html", []string{"ps", "sbx_html"}},
		{"kill", []string{"kill", "sbx_1", "7"}},
		{"kill-json", []string{"kill", "--json", "--signal", "term", "--account", "acct", "sbx_1", "7"}},
		{"kill-error", []string{"kill", "--signal", "SIGFOO", "sbx_1", "8"}},
		{"ls-status", []string{"ls", "--status", "stopped"}},
		{"exec-timeout", []string{"exec", "--timeout", "2s", "sbx_slow", "--", "sleep", "9"}},
		{"exec-stdin-keep-running", []string{"exec", "--keep-running", "-i", "sbx_1", "--", "cat"}},
		{"exec-keep-running-pipe", []string{"exec", "--keep-running", "sbx_1", "--", "cat"}},
		{"logs", []string{"logs", "run_1"}},
		{"logs-json", []string{"logs", "--json", "run_1"}},
		{"create-follow", []string{"create", "--follow", "--", "sh", "-c", "echo hello; exit 3"}},
		{"create-follow-json", []string{"create", "--follow", "--json", "--", "true"}},
		{"create-follow-nothing", []string{"create", "--follow"}},
		{"inspect", []string{"inspect", "sbx_9"}},
		{"inspect-json", []string{"get", "--json", "sbx_9"}},
		{"inspect-unknown", []string{"inspect", "sbx_none"}},
		{"rm", []string{"rm", "sbx_3"}},
		{"rm-running", []string{"rm", "sbx_1"}},
		{"rm-json", []string{"rm", "--json", "sbx_3"}},
		{"timeout", []string{"timeout", "sbx_1", "1h"}},
		{"extend", []string{"extend", "sbx_1", "50m0.5s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			last = "" // a command that sends nothing shows none
			mu.Unlock()
			cmd := newSandboxCmd(&globals{})
			var stdout, stderr bytes.Buffer
			cmd.SetOut(&stdout)
			cmd.SetErr(&stderr)
			if in, ok := stdins[tc.name]; ok {
				cmd.SetIn(strings.NewReader(in))
			}
			cmd.SetArgs(append([]string{"--url", srv.URL, "--key", "sbx_k"}, tc.args...))
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.ExecuteContext(t.Context())
			mu.Lock()
			req := last
			mu.Unlock()
			got := fmt.Sprintf("== request\n%s\n== stdout\n%s== stderr\n%s== error\n%v\n", req, stdout.String(), stderr.String(), err)
			path := filepath.Join("testdata", "client", tc.name+".golden")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("output changed:\n--- got\n%s--- want\n%s", got, want)
			}
		})
	}
}

// canonicalJSON rewrites a request body with sorted keys, so the golden
// files compare what was sent rather than the order it was written in.
func canonicalJSON(t *testing.T, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Errorf("request body %q: %v", b, err)
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
