package runtimetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Harness tells the suite how to make runtimes of a backend.
type Harness struct {
	// New returns a Runtime keeping its state in stateDir. Called again with
	// the same stateDir after Close, it must find the sandboxes (a restart).
	New func(t *testing.T, stateDir string) runtime.Runtime
	// Leaks is called before a sandbox is destroyed and returns a check to
	// run after: it lists what the backend still holds on the host for that
	// sandbox (mounts, cgroups, processes, state); the suite fails if the
	// list is not empty. Nil skips the check.
	Leaks func(t *testing.T, stateDir string, sb runtime.Sandbox) func() []string
}

// suite carries what the subtests share.
type suite struct {
	h     Harness
	rt    runtime.Runtime
	state string
	base  string
	n     int
	mu    sync.Mutex
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h, state: t.TempDir(), base: Rootfs(t)}
	s.rt = h.New(t, s.state)
	t.Cleanup(func() { s.rt.Close() })
	t.Run("Kernel", s.testKernel)
	t.Run("Exec", s.testExec)
	t.Run("AnyRootFS", s.testAnyRootFS)
	t.Run("Streaming", s.testStreaming)
	t.Run("ResizeAndSignal", s.testResizeAndSignal)
	t.Run("TerminalSignals", s.testTerminalSignals)
	t.Run("Processes", s.testProcesses)
	t.Run("Files", s.testFiles)
	t.Run("AgentTransport", s.testAgentTransport)
	t.Run("Isolation", s.testIsolation)
	t.Run("Home", s.testHome)
	t.Run("MemoryBomb", s.testMemoryBomb)
	t.Run("BigFile", s.testBigFile)
	t.Run("Tmp", s.testTmp)
	t.Run("Volumes", s.testVolumes)
	t.Run("ForkBomb", s.testForkBomb)
	t.Run("Snapshot", s.testSnapshot)
	t.Run("LayerBounds", s.testLayerBounds)
	t.Run("Prewarm", s.testPrewarm)
	t.Run("Pool", s.testPool)
	t.Run("PauseResume", s.testPauseResume)
	t.Run("Fork", s.testFork)
	t.Run("Move", s.testMove)
	t.Run("StopThenSnapshot", s.testStop)
	t.Run("Destroy", s.testDestroy)
	t.Run("Reattach", s.testReattach)
}

func (s *suite) id(t *testing.T) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return fmt.Sprintf("t%d-%s", s.n, strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))[:min(40, len(t.Name()))])
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create starts a sandbox and destroys it when the test ends.
func (s *suite) create(t *testing.T, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	if spec.ID == "" {
		spec.ID = s.id(t)
	}
	if spec.BaseDir == "" {
		spec.BaseDir = s.base
	}
	if spec.BaseImage == "" {
		spec.BaseImage = "busybox-fixture"
	}
	sb, err := s.rt.Create(ctxT(t, time.Minute), spec)
	if err != nil {
		t.Fatalf("create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroy %s: %v", spec.ID, err)
		}
	})
	return sb
}

type execOut struct {
	stdout, stderr string
	res            runtime.ExecResult
	err            error
}

func run(t *testing.T, sb runtime.Sandbox, req runtime.ExecRequest) execOut {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	res, err := sb.Exec(ctxT(t, time.Minute), req)
	return execOut{out.String(), errb.String(), res, err}
}

// sh runs a shell script and requires exit 0.
func sh(t *testing.T, sb runtime.Sandbox, script string) string {
	t.Helper()
	o := run(t, sb, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}})
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("%s: exit %d err %v\nstdout: %s\nstderr: %s", script, o.res.ExitCode, o.err, o.stdout, o.stderr)
	}
	return o.stdout
}

func (s *suite) testKernel(t *testing.T) {
	sb := s.create(t, runtime.Spec{})
	inside := strings.TrimSpace(sh(t, sb, "cat /proc/version"))
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if inside == "" || inside == strings.TrimSpace(string(host)) {
		t.Fatalf("/proc/version inside is the host's: %q", inside)
	}
	info := sb.Info()
	if info.Backend != s.rt.Name() || info.Kernel == "" {
		t.Errorf("info %+v", info)
	}
	if strings.Contains(string(host), " "+info.Kernel+" ") {
		t.Errorf("Info().Kernel %q is the host's", info.Kernel)
	}
	t.Logf("inside: %s; info %+v", inside, info)
}

func (s *suite) testExec(t *testing.T) {
	sb := s.create(t, runtime.Spec{Env: []string{"SPEC_VAR=spec", "OVERRIDE=spec"}})
	cases := []struct {
		name     string
		req      runtime.ExecRequest
		wantOut  string
		wantErr  string
		wantCode int
		wantIs   error
		check    func(t *testing.T, res runtime.ExecResult)
	}{
		{name: "env from spec and request", req: runtime.ExecRequest{Cmd: []string{"sh", "-c", `echo "$SPEC_VAR $OVERRIDE $REQ_VAR"`}, Env: []string{"OVERRIDE=req", "REQ_VAR=r"}}, wantOut: "spec req r\n"},
		{name: "default cwd is /workspace", req: runtime.ExecRequest{Cmd: []string{"pwd"}}, wantOut: "/workspace\n"},
		{name: "cwd", req: runtime.ExecRequest{Cmd: []string{"pwd"}, Cwd: "/etc"}, wantOut: "/etc\n"},
		{name: "stdin", req: runtime.ExecRequest{Cmd: []string{"sh", "-c", "tr a-z A-Z"}, Stdin: strings.NewReader("shout\n")}, wantOut: "SHOUT\n"},
		{name: "exit code", req: runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo err >&2; exit 42"}}, wantErr: "err\n", wantCode: 42},
		{name: "command not found", req: runtime.ExecRequest{Cmd: []string{"definitely-not-here"}}, wantCode: 127, wantIs: runtime.ErrCommandNotFound, wantErr: "not found"},
		{name: "timeout", req: runtime.ExecRequest{Cmd: []string{"sleep", "30"}, Timeout: 500 * time.Millisecond}, wantCode: 137,
			check: func(t *testing.T, res runtime.ExecResult) {
				if !res.TimedOut || res.Duration > 10*time.Second {
					t.Errorf("result %+v, want TimedOut soon after 500ms", res)
				}
			}},
		{name: "tty", req: runtime.ExecRequest{Cmd: []string{"sh", "-c", "test -t 0 && test -t 1 && echo tty; stty size"}, TTY: true, Rows: 33, Cols: 101}, wantOut: "tty\r\n33 101\r\n"},
		{name: "no tty", req: runtime.ExecRequest{Cmd: []string{"sh", "-c", "test -t 1 || echo notty"}}, wantOut: "notty\n"},
		{name: "root user", req: runtime.ExecRequest{Cmd: []string{"id", "-u"}}, wantOut: "0\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := run(t, sb, tc.req)
			if tc.wantIs != nil {
				if !errors.Is(o.err, tc.wantIs) {
					t.Fatalf("err %v, want %v", o.err, tc.wantIs)
				}
			} else if o.err != nil {
				t.Fatal(o.err)
			}
			if o.res.ExitCode != tc.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", o.res.ExitCode, tc.wantCode, o.stderr)
			}
			if tc.wantOut != "" && o.stdout != tc.wantOut {
				t.Errorf("stdout %q, want %q", o.stdout, tc.wantOut)
			}
			if tc.wantErr != "" && !strings.Contains(o.stderr, tc.wantErr) {
				t.Errorf("stderr %q, want %q in it", o.stderr, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, o.res)
			}
		})
	}
	// Many at once: the channel multiplexes.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			_, err := sb.Exec(context.Background(), runtime.ExecRequest{Cmd: []string{"echo", strconv.Itoa(i)}, Stdout: &out})
			if err == nil && out.String() != strconv.Itoa(i)+"\n" {
				err = fmt.Errorf("exec %d printed %q", i, out.String())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// timedWriter records when each chunk arrives.
type timedWriter struct {
	mu     sync.Mutex
	chunks []string
	at     []time.Time
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.chunks = append(w.chunks, string(p))
	w.at = append(w.at, time.Now())
	return len(p), nil
}

func (s *suite) testStreaming(t *testing.T) {
	sb := s.create(t, runtime.Spec{})
	var w timedWriter
	_, err := sb.Exec(ctxT(t, time.Minute), runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo a; sleep 1; echo b"}, Stdout: &w})
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.chunks) < 2 || w.chunks[0] != "a\n" {
		t.Fatalf("chunks %q: want \"a\\n\" delivered on its own", w.chunks)
	}
	if lead := end.Sub(w.at[0]); lead < 500*time.Millisecond {
		t.Fatalf("first chunk arrived only %v before the end: output is not streamed", lead)
	}
}

// testResizeAndSignal checks that a running process sees its terminal
// resized (SIGWINCH and the new size) and receives a signal sent while it
// runs: what an interactive shell through the API needs.
func (s *suite) testResizeAndSignal(t *testing.T) {
	sb := s.create(t, runtime.Spec{})
	// Each script says "ready" once its trap is set, then waits for what
	// the test sends; without it, it exits 3 after 30 seconds.
	const wait = `echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 3`
	t.Run("resize", func(t *testing.T) {
		resize := make(chan runtime.WindowSize, 1)
		req := runtime.ExecRequest{Cmd: []string{"sh", "-c", `trap 'stty size; exit 0' WINCH; ` + wait}, TTY: true, Rows: 24, Cols: 80, Resize: resize}
		code, out := runInterrupted(t, sb, req, func() { resize <- runtime.WindowSize{Rows: 50, Cols: 132} })
		if code != 0 || !strings.Contains(out, "50 132") {
			t.Fatalf("exit %d, output %q: want the WINCH trap to print \"50 132\" and exit 0", code, out)
		}
	})
	t.Run("signal", func(t *testing.T) {
		signal := make(chan syscall.Signal, 1)
		req := runtime.ExecRequest{Cmd: []string{"sh", "-c", `trap 'echo got-term; exit 7' TERM; ` + wait}, Signal: signal}
		code, out := runInterrupted(t, sb, req, func() { signal <- syscall.SIGTERM })
		if code != 7 || !strings.Contains(out, "got-term") {
			t.Fatalf("exit %d, output %q: want the TERM trap to run and exit 7", code, out)
		}
	})
}

// testProcesses checks that a process outlives the request that started
// it (Detach), is listed, can be followed again from where its caller
// stopped, and that a kill by pid takes its whole tree.
func (s *suite) testProcesses(t *testing.T) {
	sb := s.create(t, runtime.Spec{})
	first := &syncBuffer{}
	pids := make(chan int, 1)
	ctx, cancel := context.WithCancel(ctxT(t, time.Minute))
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, runtime.ExecRequest{
			Cmd:    []string{"sh", "-c", `sleep 1000 & echo $! > /tmp/child; echo one; i=0; while [ ! -e /tmp/go ]; do sleep 0.05; i=$((i+1)); [ $i -lt 600 ] || exit 3; done; echo two; sleep 1000`},
			Tag:    "conformance-1",
			Detach: true, Stdout: first, Started: func(pid int) { pids <- pid },
		})
		done <- err
	}()
	pid := <-pids
	waitOutput(t, first, "one\n")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("detached exec ended with %v, want context.Canceled", err)
	}
	procs, err := sb.Processes(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var listed *runtime.Process
	for i := range procs {
		if procs[i].Tag == "conformance-1" {
			listed = &procs[i]
		}
	}
	if listed == nil || listed.PID != pid || listed.Cmd[0] != "sh" || listed.Started.IsZero() {
		t.Fatalf("processes %+v: want pid %d tagged conformance-1 running sh", procs, pid)
	}
	rest := &syncBuffer{}
	attached := make(chan execOut, 1)
	go func() {
		res, err := sb.Attach(ctxT(t, time.Minute), runtime.AttachRequest{Tag: "conformance-1", Stdout: rest, From: runtime.StreamOffsets{Stdout: uint64(len("one\n"))}})
		attached <- execOut{res: res, err: err}
	}()
	sh(t, sb, "touch /tmp/go")
	waitOutput(t, rest, "two\n")
	if got := rest.String(); got != "two\n" {
		t.Errorf("attached from after \"one\": %q, want only \"two\"", got)
	}
	if err := sb.SignalProcess(ctxT(t, 30*time.Second), pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	o := <-attached
	if o.err != nil || o.res.ExitCode != 137 {
		t.Fatalf("attach after the kill: exit %d, %v; want 137", o.res.ExitCode, o.err)
	}
	if out := sh(t, sb, `kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo gone`); strings.TrimSpace(out) != "gone" {
		t.Errorf("the killed process's child is %s", out)
	}
	if err := sb.SignalProcess(ctxT(t, 30*time.Second), pid, syscall.SIGKILL); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to an ended process: %v, want fs.ErrNotExist", err)
	}
}

func waitOutput(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q: %q never came", b.String(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runInterrupted runs req, calls send once its output says "ready", and
// returns the exit code and the whole output.
func runInterrupted(t *testing.T, sb runtime.Sandbox, req runtime.ExecRequest, send func()) (int, string) {
	t.Helper()
	out := &syncBuffer{}
	req.Stdout = out
	done := make(chan execOut, 1)
	go func() {
		res, err := sb.Exec(ctxT(t, time.Minute), req)
		done <- execOut{res: res, err: err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "ready") {
		if time.Now().After(deadline) {
			t.Fatalf("output %q: \"ready\" never came", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	send()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.res.ExitCode, out.String()
}

// syncBuffer is a bytes.Buffer safe for the exec's writer and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (s *suite) testFiles(t *testing.T) {
	sb := s.create(t, runtime.Spec{})
	ctx := ctxT(t, 2*time.Minute)
	data := make([]byte, 10<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if err := sb.WriteFile(ctx, "/workspace/in/big.bin", bytes.NewReader(data), 0o640); err != nil {
		t.Fatal(err)
	}
	inside := strings.Fields(sh(t, sb, "sha256sum /workspace/in/big.bin; stat -c %a /workspace/in/big.bin"))
	if len(inside) < 3 || inside[0] != hex.EncodeToString(sum[:]) || inside[2] != "640" {
		t.Fatalf("inside: %v, want hash %x and mode 640", inside, sum)
	}
	made := strings.Fields(sh(t, sb, "head -c 10485760 /dev/urandom > /tmp/out.bin; sha256sum /tmp/out.bin"))[0]
	rc, err := sb.ReadFile(ctx, "/tmp/out.bin")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, rc)
	rc.Close()
	if err != nil || n != 10<<20 || hex.EncodeToString(h.Sum(nil)) != made {
		t.Fatalf("read back %d bytes, err %v, hash %x want %s", n, err, h.Sum(nil), made)
	}
	ents, err := sb.ListDir(ctx, "/workspace/in")
	if err != nil || len(ents) != 1 || ents[0].Name != "big.bin" || ents[0].Size != 10<<20 {
		t.Fatalf("list: %+v %v", ents, err)
	}
	if _, err := sb.ReadFile(ctx, "/no/such/file"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("read missing: %v, want fs.ErrNotExist", err)
	}
	if _, err := sb.ListDir(ctx, "/no/such/dir"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("list missing: %v, want fs.ErrNotExist", err)
	}
}

func (s *suite) testIsolation(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := s.create(t, runtime.Spec{})
	b := s.create(t, runtime.Spec{})
	sh(t, a, "echo mine > /workspace/a-secret")
	for _, p := range []string{secret, "/proc/1/root" + secret} {
		if o := run(t, b, runtime.ExecRequest{Cmd: []string{"cat", p}}); o.res.ExitCode == 0 || strings.Contains(o.stdout, "host only") {
			t.Errorf("sandbox read host file %s: %q", p, o.stdout)
		}
	}
	if o := run(t, b, runtime.ExecRequest{Cmd: []string{"cat", "/workspace/a-secret"}}); o.res.ExitCode == 0 {
		t.Errorf("sandbox b sees a's file: %q", o.stdout)
	}
	// Nor by the host path of a's layer, or by searching the whole tree.
	found := run(t, b, runtime.ExecRequest{Cmd: []string{"sh", "-c", "find / -name a-secret 2>/dev/null; cat " + s.state + "/*/*/layer/upper/workspace/a-secret 2>/dev/null"}})
	if strings.Contains(found.stdout, "a-secret") || strings.Contains(found.stdout, "mine") {
		t.Errorf("sandbox b found a's layer: %q", found.stdout)
	}
	// No network to the host: a host listener on loopback is unreachable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if o := run(t, b, runtime.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("wget -q -T 2 -O- http://127.0.0.1:%d/ || nc -w 2 127.0.0.1 %d </dev/null", port, port)}}); o.res.ExitCode == 0 {
		t.Errorf("sandbox reached a host port: %q", o.stdout)
	}
}

func (s *suite) testHome(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "home %s %s", r.Method, r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	sb := s.create(t, runtime.Spec{HomeSocket: sock})
	for i := range 3 {
		out := sh(t, sb, "wget -q -O- http://sandboxd.internal/api/health")
		if out != "home GET /api/health" {
			t.Fatalf("request %d: %q", i, out)
		}
	}
	// A sandbox without a home socket gets a refused connection, not a hang.
	other := s.create(t, runtime.Spec{})
	o := run(t, other, runtime.ExecRequest{Cmd: []string{"wget", "-q", "-T", "5", "-O-", "http://sandboxd.internal/"}, Timeout: 30 * time.Second})
	if o.res.ExitCode == 0 || o.res.TimedOut {
		t.Errorf("home without a socket: %+v %q", o.res, o.stdout)
	}
}

func (s *suite) testMemoryBomb(t *testing.T) {
	limit := int64(256 << 20)
	bomb := s.create(t, runtime.Spec{Limits: runtime.Limits{MemoryBytes: limit}})
	bystander := s.create(t, runtime.Spec{})
	sh(t, bomb, "echo before > /workspace/state")
	// busybox tail keeps a line until its newline: /dev/zero has none.
	o := run(t, bomb, runtime.ExecRequest{Cmd: []string{"tail", "/dev/zero"}, Timeout: 2 * time.Minute})
	if o.err != nil {
		t.Fatalf("memory bomb: %v", o.err)
	}
	if o.res.ExitCode == 0 || o.res.TimedOut {
		t.Fatalf("memory bomb was not killed: %+v", o.res)
	}
	if !o.res.OOMKilled {
		t.Errorf("memory bomb ended %+v: not reported as OOMKilled", o.res)
	}
	t.Logf("memory bomb ended: %+v", o.res)
	// The sandbox itself carries on, and so do its neighbour and the host.
	if got := sh(t, bomb, "cat /workspace/state"); got != "before\n" {
		t.Errorf("bombed sandbox lost its state: %q", got)
	}
	if got := sh(t, bystander, "echo fine"); got != "fine\n" {
		t.Errorf("bystander: %q", got)
	}
	st, err := bomb.Stats(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryBytes > limit {
		t.Errorf("memory after the bomb %d > limit %d", st.MemoryBytes, limit)
	}
}

// testBigFile writes and reads a file larger than the sandbox's memory: the
// file's page cache is not the sandbox's memory, and nothing is killed for
// it (a guard that counted the cache killed dd here).
func (s *suite) testBigFile(t *testing.T) {
	sb := s.create(t, runtime.Spec{Limits: runtime.Limits{MemoryBytes: 128 << 20}})
	o := run(t, sb, runtime.ExecRequest{Cmd: []string{"sh", "-c",
		"dd if=/dev/zero of=/workspace/big bs=1M count=160 2>/dev/null && sync && cat /workspace/big > /dev/null && wc -c < /workspace/big && rm /workspace/big"},
		Timeout: 3 * time.Minute})
	if o.err != nil || o.res.ExitCode != 0 || strings.TrimSpace(o.stdout) != "167772160" {
		t.Fatalf("a 160 MiB file in a 128 MiB sandbox: %v %+v %q %q", o.err, o.res, o.stdout, o.stderr)
	}
}

// stoppedSoon says whether sb is found not running within a few seconds:
// an agent whose connection closed because its sandbox went down.
func stoppedSoon(sb runtime.Sandbox) bool {
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := sb.State(ctx)
		cancel()
		if errors.Is(err, runtime.ErrNotFound) || err == nil && st != runtime.StateRunning {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (s *suite) testForkBomb(t *testing.T) {
	const pids = 64
	// bombRan processes at once (an idle sandbox has 2 or 3) show the bomb
	// ran. Not pids/2: a current gVisor refuses forks past the limit so
	// promptly that the bomb's shells die about as fast as they start, and
	// the population seen from outside was 11 to 27 of 64 (systrap); its
	// shells' "can't fork" errors show it too.
	const bombRan = pids / 4
	sb := s.create(t, runtime.Spec{Limits: runtime.Limits{Pids: pids}})
	bystander := s.create(t, runtime.Spec{})
	done := make(chan execOut, 1)
	go func() {
		done <- run(t, sb, runtime.ExecRequest{Cmd: []string{"sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60"}, Timeout: 15 * time.Second})
	}()
	// Count processes inside through the agent's file service: forking
	// anything there fails while the bomb holds every slot. On a loaded
	// host the bomb ramps up slowly, so watch until it has filled half the
	// slots and a while longer (to catch any overshoot), or until shortly
	// before its timeout.
	peak := 0
	ctx := ctxT(t, time.Minute)
	deadline := time.Now().Add(13 * time.Second)
	var filled time.Time
	died := false
	for time.Now().Before(deadline) && (filled.IsZero() || time.Since(filled) < 2*time.Second) {
		ents, err := sb.ListDir(ctx, "/proc")
		if errors.Is(err, runtime.ErrNotRunning) || err != nil && stoppedSoon(sb) {
			// On a loaded host the bomb has taken its own sandbox down
			// (its agent with it): contained all the same, as long as the
			// neighbour keeps working (checked below). Seen under CI's
			// parallel packages, not alone; see the closing note. The
			// call may also end as the agent's connection closes, before
			// the runtime says the sandbox stopped.
			died = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name); err == nil {
				n++
			}
		}
		peak = max(peak, n)
		if peak >= bombRan && filled.IsZero() {
			filled = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	o := <-done
	t.Logf("fork bomb: peak %d processes inside (limit %d); result %+v", peak, pids, o.res)
	// The same outcome, seen by the bomb's own exec after the watch ended.
	if errors.Is(o.err, runtime.ErrNotRunning) {
		died = true
	}
	if died {
		t.Logf("fork bomb: the bombed sandbox stopped (%v); only its neighbour is checked", o.err)
		if peak > pids {
			t.Errorf("%d processes inside, limit %d", peak, pids)
		}
		if got := sh(t, bystander, "echo fine"); got != "fine\n" {
			t.Errorf("bystander: %q", got)
		}
		return
	}
	if peak > pids {
		t.Errorf("%d processes inside, limit %d", peak, pids)
	}
	// The bomb ran into the limit: many processes at once, or its shells
	// saying that fork failed.
	if hitLimit := strings.Contains(o.stderr, "fork"); peak < bombRan && !hitLimit {
		t.Errorf("peak %d and no failed fork in its stderr (%q): the bomb did not run", peak, tail(o.stderr, 300))
	}
	if !o.res.TimedOut {
		t.Errorf("bomb result %+v (%v): want it killed at its timeout", o.res, o.err)
	}
	// Once the bomb is gone (its session was killed at the timeout) the
	// sandbox works again, and the neighbour never stopped.
	var out string
	for range 50 {
		o := run(t, sb, runtime.ExecRequest{Cmd: []string{"echo", "recovered"}})
		if o.err == nil && o.res.ExitCode == 0 {
			out = o.stdout
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out != "recovered\n" {
		t.Errorf("sandbox did not recover from the fork bomb")
	}
	if got := sh(t, bystander, "echo fine"); got != "fine\n" {
		t.Errorf("bystander: %q", got)
	}
}

// fsState prints what the snapshot test checks, from inside a sandbox.
const fsState = `
cat /etc/added; cat /workspace/proj/main.txt; cat /root/.config/tool.conf
test -e /usr/share/doc/README && echo README-present || echo README-deleted
ls /usr/share/doc | tr '\n' ' '; echo
ls /opt/replaced | tr '\n' ' '; echo
stat -c '%a %u' /workspace/proj/run.sh
readlink /workspace/link
cat /etc/hostname
`

func (s *suite) testSnapshot(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	a := s.create(t, runtime.Spec{})
	sh(t, a, `
		echo added > /etc/added
		mkdir -p /workspace/proj /root/.config /opt/replaced
		echo v1 > /workspace/proj/main.txt
		echo conf > /root/.config/tool.conf
		echo old > /opt/replaced/old.txt
		rm /usr/share/doc/README
		echo '#!/bin/sh' > /workspace/proj/run.sh; chmod 750 /workspace/proj/run.sh; chown 1000 /workspace/proj/run.sh
		ln -s proj/main.txt /workspace/link
		echo changed > /etc/hostname`)
	// /usr/share/doc is replaced wholesale: an opaque directory.
	sh(t, a, "rm -rf /usr/share/doc && mkdir /usr/share/doc && echo new > /usr/share/doc/new.txt")
	want := sh(t, a, fsState)
	var blob bytes.Buffer
	m1, err := a.Snapshot(ctx, &blob)
	if err != nil {
		t.Fatal(err)
	}
	if m1.ID == "" || m1.Parent != "" || m1.BaseImage != "busybox-fixture" || m1.Size != int64(blob.Len()) {
		t.Fatalf("manifest %+v (blob %d bytes)", m1, blob.Len())
	}
	// The source keeps running after a snapshot.
	sh(t, a, "echo still running")

	b := s.create(t, runtime.Spec{Layers: []runtime.Layer{{ID: m1.ID, R: bytes.NewReader(blob.Bytes())}}})
	if got := sh(t, b, fsState); got != want {
		t.Fatalf("restored sandbox differs:\n got %q\nwant %q", got, want)
	}
	if !strings.Contains(want, "README-deleted") || strings.Contains(want, "keep.txt") {
		t.Fatalf("the test's own expectations are off: %q", want)
	}

	// A second generation on top records its parent and carries only the
	// difference; the chain restores both.
	sh(t, b, "echo v2 > /workspace/proj/main.txt; rm /etc/added; echo gen2 > /workspace/gen2")
	want2 := sh(t, b, fsState+"cat /workspace/gen2; test -e /etc/added || echo added-deleted")
	var blob2 bytes.Buffer
	m2, err := b.Snapshot(ctx, &blob2)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Parent != m1.ID {
		t.Fatalf("second snapshot's parent %q, want %q", m2.Parent, m1.ID)
	}
	c := s.create(t, runtime.Spec{Layers: []runtime.Layer{
		{ID: m1.ID, R: bytes.NewReader(blob.Bytes())},
		{ID: m2.ID, R: bytes.NewReader(blob2.Bytes())},
	}})
	if got := sh(t, c, fsState+"cat /workspace/gen2; test -e /etc/added || echo added-deleted"); got != want2 {
		t.Fatalf("chain restore differs:\n got %q\nwant %q", got, want2)
	}
	// A corrupted layer is refused, not half-restored.
	bad := bytes.Clone(blob.Bytes())
	bad[len(bad)/2] ^= 0xff
	if _, err := s.rt.Create(ctx, runtime.Spec{ID: s.id(t) + "-bad", BaseDir: s.base, Layers: []runtime.Layer{{ID: m1.ID, R: bytes.NewReader(bad)}}}); err == nil {
		t.Fatal("a corrupted layer was restored")
	}
}

func (s *suite) testStop(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	sb := s.create(t, runtime.Spec{})
	sh(t, sb, "echo kept > /workspace/kept")
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := sb.State(ctx); err != nil || st != runtime.StateStopped {
		t.Fatalf("state after stop: %v %v", st, err)
	}
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, runtime.ErrNotRunning) {
		t.Fatalf("exec in a stopped sandbox: %v, want ErrNotRunning", err)
	}
	var blob bytes.Buffer
	if _, err := sb.Snapshot(ctx, &blob); err != nil {
		t.Fatalf("snapshot of a stopped sandbox: %v", err)
	}
	r := s.create(t, runtime.Spec{Layers: []runtime.Layer{{R: &blob}}})
	if got := sh(t, r, "cat /workspace/kept"); got != "kept\n" {
		t.Fatalf("restored %q", got)
	}
}

func (s *suite) testDestroy(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	id := s.id(t)
	sb, err := s.rt.Create(ctx, runtime.Spec{ID: id, BaseDir: s.base, Limits: runtime.Limits{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	// The disk limit holds: writing past it fails inside.
	o := run(t, sb, runtime.ExecRequest{Cmd: []string{"sh", "-c", "head -c 100000000 /dev/zero > /workspace/fill"}})
	if o.res.ExitCode == 0 {
		t.Errorf("wrote 100 MB into a 64 MiB writable layer")
	}
	if _, err := s.rt.Create(ctx, runtime.Spec{ID: id, BaseDir: s.base}); !errors.Is(err, runtime.ErrExists) {
		t.Errorf("second create with the same id: %v, want ErrExists", err)
	}
	check := func() []string { return nil }
	if s.h.Leaks != nil {
		check = s.h.Leaks(t, s.state, sb)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if leaks := check(); len(leaks) > 0 {
		t.Errorf("destroy left behind: %v", leaks)
	}
	if _, err := s.rt.Get(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("get after destroy: %v, want ErrNotFound", err)
	}
	ids, err := s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range ids {
		if got == id {
			t.Errorf("list after destroy still has %s", id)
		}
	}
}

func (s *suite) testReattach(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	sb := s.create(t, runtime.Spec{Env: []string{"KEEP=env"}})
	id := sb.ID()
	sh(t, sb, "echo survived > /workspace/x")
	if err := s.rt.Close(); err != nil {
		t.Fatal(err)
	}
	s.rt = s.h.New(t, s.state) // the suite's other users get the new one
	ids, err := s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(ids, id) {
		t.Fatalf("list after restart %v lacks %s", ids, id)
	}
	again, err := s.rt.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Destroy(context.Background()) })
	if st, err := again.State(ctx); err != nil || st != runtime.StateRunning {
		t.Fatalf("state after restart: %v %v", st, err)
	}
	if got := sh(t, again, `cat /workspace/x; echo "$KEEP"`); got != "survived\nenv\n" {
		t.Fatalf("after restart: %q", got)
	}
	if _, err := s.rt.Get(ctx, "never-created"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("get unknown: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
