package codeint

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// These tests drive real kernels: Debian's python3-ipykernel,
// python3-jupyter-client, python3-pandas and python3-matplotlib, which
// scripts/install-test-tools.sh installs.
const python = "/usr/bin/python3"

func requireJupyter(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import jupyter_client, ipykernel, pandas, matplotlib").Run(); err != nil {
		t.Fatalf("these tests need Debian's Jupyter packages (scripts/install-test-tools.sh): %v", err)
	}
}

// launchHere runs the shim as the test's own user.
func launchHere(t *testing.T) Launcher {
	return func(c Caller, argv, env []string) (*Process, error) {
		cmd := exec.Command(python, argv[1:]...)
		cmd.Env, cmd.Dir = env, c.Dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		go func() { _ = cmd.Wait() }()
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		return &Process{Stdin: in, Stdout: out, Kill: func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }}, nil
	}
}

type server struct {
	t   *testing.T
	url string
}

func newServer(t *testing.T) *server {
	requireJupyter(t)
	dir := t.TempDir()
	in := New(launchHere(t), nil, nil)
	t.Cleanup(in.Close)
	c := Caller{User: "tester", Env: []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "BASE=base"}, Dir: dir}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { in.ServeHTTP(w, r, c) }))
	t.Cleanup(ts.Close)
	return &server{t: t, url: ts.URL}
}

func (s *server) do(method, path string, body any) (int, []byte) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, s.url+path, bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// run executes req and returns its lines, checking the stream's shape:
// JSON objects, no blank line, end_of_execution last.
func (s *server) run(req map[string]any) []map[string]any {
	s.t.Helper()
	code, body := s.do("POST", "/execute", req)
	if code != 200 {
		s.t.Fatalf("execute %v: %d %s", req, code, body)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 32<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			s.t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) == 0 || lines[len(lines)-1]["type"] != LineEnd {
		s.t.Fatalf("execute %v: the stream does not end with %s: %s", req, LineEnd, body)
	}
	return lines
}

func of(lines []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == kind {
			out = append(out, l)
		}
	}
	return out
}

func TestExecuteKeepsStateAndGivesEveryOutput(t *testing.T) {
	s := newServer(t)
	s.run(map[string]any{"code": "x = 41"})
	lines := s.run(map[string]any{"code": "print('out'); import sys; print('err', file=sys.stderr); x + 1"})
	if r := of(lines, LineResult); len(r) != 1 || r[0]["text"] != "42" || r[0]["is_main_result"] != true {
		t.Errorf("result: %v", lines)
	}
	if o := of(lines, LineStdout); len(o) != 1 || o[0]["text"] != "out\n" || o[0]["timestamp"] == "" {
		t.Errorf("stdout: %v", lines)
	}
	if e := of(lines, LineStderr); len(e) != 1 || e[0]["text"] != "err\n" {
		t.Errorf("stderr: %v", lines)
	}
	if c := of(lines, LineCount); len(c) != 1 || c[0]["execution_count"] != float64(2) {
		t.Errorf("count: %v", lines)
	}
	// A string's repr comes back without its quotes, as from E2B.
	if r := of(s.run(map[string]any{"code": "'abc'"}), LineResult); len(r) != 1 || r[0]["text"] != "abc" {
		t.Errorf("string result: %v", r)
	}
	lines = s.run(map[string]any{"code": "def f():\n    return 1/0\nf()"})
	e := of(lines, LineError)
	if len(e) != 1 || e[0]["name"] != "ZeroDivisionError" || e[0]["value"] != "division by zero" ||
		!strings.Contains(e[0]["traceback"].(string), "----> 2     return 1/0") || strings.Contains(e[0]["traceback"].(string), "\x1b[") {
		t.Errorf("error: %v", lines)
	}
}

func TestExecuteRichResults(t *testing.T) {
	s := newServer(t)
	lines := s.run(map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None], 't': pd.to_datetime(['2024-01-01', '2024-01-02'])})"})
	r := of(lines, LineResult)
	if len(r) != 1 || !strings.Contains(r[0]["html"].(string), "<table") {
		t.Fatalf("DataFrame: %v", lines)
	}
	data, _ := json.Marshal(r[0]["data"])
	if string(data) != `{"a":[1,2],"b":["x",null],"t":["2024-01-01T00:00:00","2024-01-02T00:00:00"]}` {
		t.Errorf("DataFrame data: %s", data)
	}
	lines = s.run(map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6], label='up')\nplt.title('T')\nplt.xlabel('x')\nplt.show()"})
	r = of(lines, LineResult)
	if len(r) != 1 || r[0]["png"] == nil || r[0]["is_main_result"] != false {
		t.Fatalf("chart: %v", lines)
	}
	chart := r[0]["chart"].(map[string]any)
	if chart["type"] != "line" || chart["title"] != "T" || chart["x_label"] != "x" {
		t.Errorf("chart: %v", chart)
	}
	els := chart["elements"].([]any)
	if len(els) != 1 || els[0].(map[string]any)["label"] != "up" || len(els[0].(map[string]any)["points"].([]any)) != 3 {
		t.Errorf("chart elements: %v", els)
	}
	// A representation over the limit is left out, with a note.
	lines = s.run(map[string]any{"code": "from IPython.display import display\ndisplay({'text/plain': 'big', 'text/html': 'x' * (11 << 20)}, raw=True)"})
	r = of(lines, LineResult)
	if len(r) != 1 || r[0]["html"] != nil || !strings.Contains(r[0]["text"].(string), "text/html of 11534336 bytes left out") {
		t.Errorf("over the limit: %v", r)
	}
}

func TestExecuteEnvIsPerExecution(t *testing.T) {
	s := newServer(t)
	lines := s.run(map[string]any{"code": "import os; os.environ['BASE'], os.environ.get('ONLY'), os.getcwd() == os.environ['HOME']",
		"env_vars": map[string]string{"BASE": "cell's \"own\"", "ONLY": "x"}})
	if r := of(lines, LineResult); len(r) != 1 || r[0]["text"] != `('cell\'s "own"', 'x', True)` {
		t.Errorf("with envs: %v", lines)
	}
	lines = s.run(map[string]any{"code": "import os; os.environ['BASE'], os.environ.get('ONLY')"})
	if r := of(lines, LineResult); len(r) != 1 || r[0]["text"] != "('base', None)" {
		t.Errorf("after: %v", lines)
	}
	if code, body := s.do("POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]string{"A B": "x"}}); code != 400 {
		t.Errorf("bad name: %d %s", code, body)
	}
}

func TestExecuteTimeoutInterruptsAndKeepsState(t *testing.T) {
	s := newServer(t)
	s.run(map[string]any{"code": "kept = 7"})
	start := time.Now()
	lines := s.run(map[string]any{"code": "import time\ntime.sleep(60)", "timeout_ms": 500})
	e := of(lines, LineError)
	if len(e) != 1 || e[0]["name"] != "TimeoutError" {
		t.Errorf("timeout: %v", lines)
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("the timeout did not end the cell: %s", time.Since(start))
	}
	if r := of(s.run(map[string]any{"code": "kept"}), LineResult); len(r) != 1 || r[0]["text"] != "7" {
		t.Errorf("state after the timeout: %v", r)
	}
}

func TestContexts(t *testing.T) {
	s := newServer(t)
	dir := t.TempDir()
	code, body := s.do("POST", "/contexts", map[string]any{"language": "Python", "cwd": dir})
	var cx Context
	if code != 200 || json.Unmarshal(body, &cx) != nil || cx.Language != "python" || cx.Cwd != dir || len(cx.ID) != 36 {
		t.Fatalf("create: %d %s", code, body)
	}
	lines := s.run(map[string]any{"code": "import os; os.getcwd()", "context_id": cx.ID})
	if r := of(lines, LineResult); len(r) != 1 || r[0]["text"] != dir {
		t.Errorf("cwd: %v", lines)
	}
	s.run(map[string]any{"code": "y = 1", "context_id": cx.ID})
	// The default context is another kernel.
	if e := of(s.run(map[string]any{"code": "y", "language": "python"}), LineError); len(e) != 1 || e[0]["name"] != "NameError" {
		t.Errorf("default context sees another's state: %v", e)
	}
	code, body = s.do("GET", "/contexts", nil)
	var list []Context
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list) != 2 {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body := s.do("POST", "/contexts/"+cx.ID+"/restart", nil); code != 200 || strings.TrimSpace(string(body)) != "null" {
		t.Errorf("restart: %d %s", code, body)
	}
	if e := of(s.run(map[string]any{"code": "y", "context_id": cx.ID}), LineError); len(e) != 1 || e[0]["name"] != "NameError" {
		t.Errorf("state after restart: %v", e)
	}
	if code, _ := s.do("DELETE", "/contexts/"+cx.ID, nil); code != 200 {
		t.Errorf("delete: %d", code)
	}
	if code, body := s.do("POST", "/execute", map[string]any{"code": "1", "context_id": cx.ID}); code != 404 || !strings.Contains(string(body), "Context "+cx.ID+" not found") {
		t.Errorf("deleted context: %d %s", code, body)
	}
	if code, body := s.do("POST", "/execute", map[string]any{"code": "1", "context_id": cx.ID, "language": "python"}); code != 400 {
		t.Errorf("both: %d %s", code, body)
	}
	if code, body := s.do("POST", "/execute", map[string]any{"code": "1", "language": "cobol"}); code != 400 || !strings.Contains(string(body), `no kernel for language "cobol"`) {
		t.Errorf("unknown language: %d %s", code, body)
	}
	if code, body := s.do("GET", "/health", nil); code != 200 || strings.TrimSpace(string(body)) != `"OK"` {
		t.Errorf("health: %d %s", code, body)
	}
}

func TestRestartEndsARunningCell(t *testing.T) {
	s := newServer(t)
	code, body := s.do("POST", "/contexts", map[string]any{})
	var cx Context
	if code != 200 || json.Unmarshal(body, &cx) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	done := make(chan []map[string]any)
	go func() { done <- s.run(map[string]any{"code": "import time\ntime.sleep(60)", "context_id": cx.ID}) }()
	time.Sleep(time.Second)
	if code, body := s.do("POST", "/contexts/"+cx.ID+"/restart", nil); code != 200 {
		t.Fatalf("restart: %d %s", code, body)
	}
	lines := <-done
	if e := of(lines, LineError); len(e) != 1 || e[0]["name"] != "ContextRestarting" {
		t.Errorf("the running cell: %v", lines)
	}
	if r := of(s.run(map[string]any{"code": "1 + 1", "context_id": cx.ID}), LineResult); len(r) != 1 || r[0]["text"] != "2" {
		t.Errorf("after restart: %v", r)
	}
}

// TestCollectorBounds: the gathered logs keep what fits of a write past
// the bound, cut at a character, and say they were cut.
func TestCollectorBounds(t *testing.T) {
	var c Collector
	line := func(kind, text string) []byte {
		b, _ := json.Marshal(Line{Type: kind, Text: &text})
		return b
	}
	if err := c.Add(LineStdout, line(LineStdout, "start\n")); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("€", maxCollectedLog/3+10) // 3 bytes each
	if err := c.Add(LineStderr, line(LineStderr, big)); err != nil {
		t.Fatal(err)
	}
	_ = c.Add(LineStdout, line(LineStdout, "more\n"))
	x := c.X
	kept := len(x.Logs.Stdout[0]) + len(x.Logs.Stderr[0])
	if !x.Truncated || kept > maxCollectedLog || kept < maxCollectedLog-3 || len(x.Logs.Stdout) != 1 || !utf8.ValidString(x.Logs.Stderr[0]) {
		t.Errorf("truncated %v, kept %d bytes of %d, stdout %q, valid %v", x.Truncated, kept, maxCollectedLog, x.Logs.Stdout, utf8.ValidString(x.Logs.Stderr[0]))
	}
}

// TestWarm: /warm starts the default context, which the first execution
// then uses (one kernel, not two).
func TestWarm(t *testing.T) {
	s := newServer(t)
	if code, body := s.do("POST", PathWarm, map[string]any{"language": "python"}); code != http.StatusNoContent {
		t.Fatalf("warm: %d %s", code, body)
	}
	s.run(map[string]any{"code": "warmed = 1"})
	if r := of(s.run(map[string]any{"code": "warmed", "language": "python"}), LineResult); len(r) != 1 || r[0]["text"] != "1" {
		t.Errorf("the default context after warm: %v", r)
	}
	code, body := s.do("GET", "/contexts", nil)
	var list []Context
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list) != 1 {
		t.Errorf("contexts after warm and two executions: %d %s", code, body)
	}
}

// TestTimeoutOfACellThatIgnoresInterrupts: the kernel is restarted after
// the grace, the cell ends saying its state is lost, and the context runs
// the next cell.
func TestTimeoutOfACellThatIgnoresInterrupts(t *testing.T) {
	s := newServer(t)
	s.run(map[string]any{"code": "kept = 1"})
	lines := s.run(map[string]any{"code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(120)", "timeout_ms": 500})
	e := of(lines, LineError)
	if len(e) != 2 || e[0]["name"] != "TimeoutError" || e[1]["name"] != "ExecutionInterrupted" {
		t.Errorf("errors: %v", e)
	}
	if e := of(s.run(map[string]any{"code": "kept"}), LineError); len(e) != 1 || e[0]["name"] != "NameError" {
		t.Errorf("the next cell, on a new kernel: %v", e)
	}
}
