package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/files"
)

// fakeTTY is a stderr that says it is a terminal (display.Terminal), so
// that the commands draw bars on it.
type fakeTTY struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (f *fakeTTY) IsTerminal() bool { return true }

func (f *fakeTTY) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.b.Write(p)
}

func (f *fakeTTY) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.b.String()
}

// uploadServer answers POST /api/sandboxes/files on loopback as the API
// does, keeping what it received.
type uploadServer struct {
	*httptest.Server
	mu     sync.Mutex
	fields map[string]string
	files  map[string]string
	key    string
}

func newUploadServer(t *testing.T) *uploadServer {
	s := &uploadServer{fields: map[string]string{}, files: map[string]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/sandboxes/files" {
			http.NotFound(w, r)
			return
		}
		mr, err := r.MultipartReader()
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"status":"error","error":"Request body must be valid multipart/form-data"}`)
			return
		}
		resp := contract.UploadFilesResponse{Status: "success"}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Errorf("multipart: %v", err)
				return
			}
			b, _ := io.ReadAll(part)
			s.mu.Lock()
			if part.FileName() != "" {
				s.files[part.FileName()] = string(b)
				resp.Uploaded = append(resp.Uploaded, files.Committed{Path: part.FileName(), SHA: "c0ffee"})
			} else {
				s.fields[part.FormName()] = string(b)
			}
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.key = r.Header.Get("x-api-key")
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}))
	t.Cleanup(s.Close)
	return s
}

// uploadFiles writes two files, one of 3 MiB, and returns their paths.
func uploadFiles(t *testing.T) []string {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "big.bin")
	if err := os.WriteFile(a, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, bytes.Repeat([]byte{7}, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{a, b}
}

func runSandboxCmd(t *testing.T, g *globals, stderr io.Writer, args ...string) (string, error) {
	t.Helper()
	cmd := newSandboxCmd(g)
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(stderr)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(t.Context())
	return stdout.String(), err
}

func TestUploadSendsFilesAndReportsLines(t *testing.T) {
	srv := newUploadServer(t)
	paths := uploadFiles(t)
	var stderr bytes.Buffer
	out, err := runSandboxCmd(t, &globals{}, &stderr, "--url", srv.URL, "--key", "sbx_k",
		"upload", "--path", "docs", "--message", "add files", paths[0], paths[1])
	if err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.files["a.txt"] != "hello\n" || len(srv.files["big.bin"]) != 3<<20 || srv.fields["path"] != "docs" ||
		srv.fields["message"] != "add files" || srv.key != "sbx_k" {
		t.Errorf("server got fields %v, files of %d and %d bytes, key %q", srv.fields, len(srv.files["a.txt"]), len(srv.files["big.bin"]), srv.key)
	}
	if out != "PATH     SHA\na.txt    c0ffee\nbig.bin  c0ffee\n" {
		t.Errorf("stdout %q", out)
	}
	// Not a terminal: log lines, the first and the last of the task.
	e := stderr.String()
	for _, want := range []string{`msg="uploading 2 files"`, `total="3.0 MiB"`, "step=done", `done="3.0 MiB"`} {
		if !strings.Contains(e, want) {
			t.Errorf("stderr lacks %s:\n%s", want, e)
		}
	}
	if strings.Contains(e, "\r") {
		t.Errorf("a carriage return on a pipe:\n%q", e)
	}
}

func TestUploadBarOnTerminalNeverOnStdout(t *testing.T) {
	srv := newUploadServer(t)
	paths := uploadFiles(t)

	tty := &fakeTTY{}
	out, err := runSandboxCmd(t, &globals{}, tty, "--url", srv.URL, "--key", "sbx_k", "upload", paths[1])
	if err != nil {
		t.Fatal(err)
	}
	if e := tty.String(); !strings.Contains(e, "\r") || !strings.Contains(e, "uploading big.bin") || !strings.Contains(e, "100%") ||
		!strings.Contains(e, "MiB") {
		t.Errorf("no bar on the terminal:\n%q", e)
	}
	if out != "PATH     SHA\nbig.bin  c0ffee\n" {
		t.Errorf("stdout %q", out)
	}

	// --json on a terminal: stdout is the JSON alone, stderr plain lines.
	tty = &fakeTTY{}
	out, err = runSandboxCmd(t, &globals{}, tty, "--url", srv.URL, "--key", "sbx_k", "upload", "--json", paths[1])
	if err != nil {
		t.Fatal(err)
	}
	var got contract.UploadFilesResponse
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil || dec.More() || len(got.Uploaded) != 1 || got.Uploaded[0].Path != "big.bin" {
		t.Errorf("stdout is not the answer's JSON alone (%v): %q", err, out)
	}
	if e := tty.String(); strings.Contains(e, "\r") || !strings.Contains(e, "step=done") {
		t.Errorf("--json drew a bar or wrote no lines:\n%q", e)
	}
}

func TestUploadErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"status":"error","error":"over the repository quota"}`)
	}))
	defer srv.Close()
	paths := uploadFiles(t)
	tty := &fakeTTY{}
	_, err := runSandboxCmd(t, &globals{}, tty, "--url", srv.URL, "--key", "sbx_k", "upload", paths[1])
	if err == nil || !strings.Contains(err.Error(), "HTTP 429: over the repository quota") {
		t.Errorf("err %v", err)
	}
	if e := tty.String(); e != "" && !strings.Contains(e, "failed after") {
		t.Errorf("a failed upload's bar:\n%q", e)
	}
	for _, args := range [][]string{
		{"upload", filepath.Dir(paths[0])},
		{"upload", filepath.Join(filepath.Dir(paths[0]), "missing")},
		{"upload", "--account", "other", paths[0]},
	} {
		if _, err := runSandboxCmd(t, &globals{}, &bytes.Buffer{}, append([]string{"--url", srv.URL, "--key", "sbx_k"}, args...)...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestWaitShownOnlyWhenLong: a slow API call shows a spinner on a
// terminal and a line elsewhere once it passed the quiet time; a quick one
// shows nothing (TestClientOutput's golden files hold that).
func TestWaitShownOnlyWhenLong(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"success","sandbox":{"sandboxId":"sbx_1","sandboxStatus":"running"}}`)
	}))
	defer srv.Close()
	g := &globals{waitQuiet: 100 * time.Millisecond}

	tty := &fakeTTY{}
	out, err := runSandboxCmd(t, g, tty, "--url", srv.URL, "--key", "sbx_k", "resume", "sbx_1")
	if err != nil {
		t.Fatal(err)
	}
	if e := tty.String(); !strings.Contains(e, "\r") || !strings.Contains(e, "resuming sbx_1") || !strings.Contains(e, "done in") {
		t.Errorf("no spinner for a long wait:\n%q", e)
	}
	if !strings.HasPrefix(out, "ID") || strings.Contains(out, "\r") {
		t.Errorf("stdout %q", out)
	}

	var lines bytes.Buffer
	if _, err := runSandboxCmd(t, g, &lines, "--url", srv.URL, "--key", "sbx_k", "resume", "--json", "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if e := lines.String(); !strings.Contains(e, `msg="resuming sbx_1"`) || !strings.Contains(e, "step=done") || strings.Contains(e, "\r") {
		t.Errorf("no line for a long wait:\n%s", e)
	}
}

// TestBenchChartsFlag: --charts draws a report's charts into the directory
// and names them on stderr; without it nothing is written.
func TestBenchChartsFlag(t *testing.T) {
	rep := bench.TTIReport{Command: []string{"echo", "ok"}, Platform: "systrap",
		Results:     []bench.TTIResult{{Account: "fresh", Mode: "sequential", Latency: bench.Latency{N: 2, OK: 2, Samples: []float64{50, 70}}, Create: bench.Latency{N: 2, OK: 2, Samples: []float64{5, 6}}}},
		Baseline:    bench.Latency{N: 2, OK: 2, Samples: []float64{130, 150}},
		BaselineRun: bench.Latency{N: 2, OK: 2, Samples: []float64{100, 110}}}
	dir := filepath.Join(t.TempDir(), "charts")
	var stderr bytes.Buffer
	if err := writeCharts(&stderr, dir, rep); err != nil {
		t.Fatal(err)
	}
	want := "chart: " + filepath.Join(dir, "tti.svg") + "\nchart: " + filepath.Join(dir, "tti-create.svg") + "\n"
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
	for _, f := range []string{"tti.svg", "tti-create.svg"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s: %v", f, err)
		}
	}
	if err := writeCharts(&stderr, "", rep); err != nil || stderr.String() != want {
		t.Errorf("no --charts wrote something: %v %q", err, stderr.String())
	}
}
