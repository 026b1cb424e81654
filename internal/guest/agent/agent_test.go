package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
)

// pair connects a host Client to an in-process Agent over a real unix
// socket, the same transport the gVisor runtime uses.
func pair(t testing.TB, home func(net.Conn)) (*guest.Client, *agent.Agent) {
	t.Helper()
	secret := []byte("per-sandbox secret")
	c, a, err := pairWith(t, guest.ClientOptions{Home: home, Secret: secret}, secret)
	if err != nil {
		t.Fatal(err)
	}
	return c, a
}

// pairWith is pair with the host's options and the agent's secret given;
// it returns the handshake's error.
func pairWith(t testing.TB, opts guest.ClientOptions, agentSecret []byte) (*guest.Client, *agent.Agent, error) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	a := agent.New(agent.Options{Version: "test", Cwd: dir, Secret: agentSecret})
	c, err := connectAgent(t, a, ln, opts)
	return c, a, err
}

// connectAgent makes a to dial ln (again) and returns the host's side.
func connectAgent(t testing.TB, a *agent.Agent, ln net.Listener, opts guest.ClientOptions) (*guest.Client, error) {
	t.Helper()
	sock := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		_ = a.Serve(ctx, conn)
	}()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c, err := guest.Accept(conn, opts)
	if err != nil {
		cancel()
		<-served
		return nil, err
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-served
	})
	return c, nil
}

type execCase struct {
	name     string
	spec     guest.ExecSpec
	stdin    string
	wantOut  string
	wantErr  string // substring of stderr
	wantCode int
	check    func(t *testing.T, e guest.Exit)
}

func TestExec(t *testing.T) {
	c, _ := pair(t, nil)
	plainDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(plainDir, "plain"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []execCase{
		{name: "echo", spec: guest.ExecSpec{Cmd: []string{"echo", "hello"}}, wantOut: "hello\n"},
		{name: "exit code", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "exit 7"}}, wantCode: 7},
		{name: "stderr", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "echo oops >&2; exit 1"}}, wantErr: "oops", wantCode: 1},
		{name: "env", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", `echo "$FOO-$HOME"`}, Env: []string{"FOO=bar", "HOME=/h"}}, wantOut: "bar-/h\n"},
		{name: "cwd", spec: guest.ExecSpec{Cmd: []string{"pwd"}, Cwd: "/usr"}, wantOut: "/usr\n"},
		{name: "stdin", spec: guest.ExecSpec{Cmd: []string{"cat"}}, stdin: "from host\n", wantOut: "from host\n"},
		{name: "not found", spec: guest.ExecSpec{Cmd: []string{"no-such-command-xyz"}}, wantErr: "command not found", wantCode: 127,
			check: func(t *testing.T, e guest.Exit) {
				if !e.NotFound {
					t.Error("NotFound not set")
				}
			}},
		{name: "not executable", spec: guest.ExecSpec{Cmd: []string{"./plain"}, Cwd: plainDir}, wantErr: "permission denied", wantCode: 126},
		{name: "signal", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "kill -9 $$"}}, wantCode: 137,
			check: func(t *testing.T, e guest.Exit) {
				if e.Signal != 9 {
					t.Errorf("signal %d, want 9", e.Signal)
				}
			}},
		{name: "timeout kills the session", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "sleep 30 & sleep 30"}, Timeout: 200 * time.Millisecond}, wantCode: 137,
			check: func(t *testing.T, e guest.Exit) {
				if !e.TimedOut {
					t.Error("TimedOut not set")
				}
			}},
		{name: "tty", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "test -t 1 && echo tty; stty size"}, TTY: true, Rows: 30, Cols: 100}, wantOut: "tty\r\n30 100\r\n"},
		{name: "background child does not hold the exec", spec: guest.ExecSpec{Cmd: []string{"sh", "-c", "sleep 30 & echo done"}}, wantOut: "done\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			pio := guest.ExecIO{Stdout: &out, Stderr: &errb}
			if tc.stdin != "" {
				pio.Stdin = strings.NewReader(tc.stdin)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			e, err := c.Exec(ctx, tc.spec, pio)
			if err != nil {
				t.Fatal(err)
			}
			if e.Error != "" {
				t.Fatalf("exec error: %s", e.Error)
			}
			if e.Code != tc.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", e.Code, tc.wantCode, errb.String())
			}
			if tc.wantOut != "" && out.String() != tc.wantOut {
				t.Errorf("stdout %q, want %q", out.String(), tc.wantOut)
			}
			if tc.wantErr != "" && !strings.Contains(errb.String(), tc.wantErr) {
				t.Errorf("stderr %q, want it to contain %q", errb.String(), tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, e)
			}
		})
	}
}

func TestExecBadCwd(t *testing.T) {
	c, _ := pair(t, nil)
	e, err := c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"true"}, Cwd: "/no/such/dir"}, guest.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	if e.Error == "" {
		t.Fatalf("exec in a missing directory succeeded: %+v", e)
	}
}

// chunkTimes records when each write arrives.
type chunkTimes struct {
	mu    sync.Mutex
	times []time.Time
	data  []string
}

func (c *chunkTimes) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times = append(c.times, time.Now())
	c.data = append(c.data, string(p))
	return len(p), nil
}

func TestExecStreamsIncrementally(t *testing.T) {
	c, _ := pair(t, nil)
	var ct chunkTimes
	_, err := c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"sh", "-c", "echo a; sleep 1; echo b"}}, guest.ExecIO{Stdout: &ct})
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if len(ct.data) < 2 || ct.data[0] != "a\n" {
		t.Fatalf("chunks %q, want a then b separately", ct.data)
	}
	// The first chunk must arrive while the command still runs, i.e. well
	// before it ends (it sleeps for a second after printing it).
	if end.Sub(ct.times[0]) < 500*time.Millisecond {
		t.Errorf("first chunk arrived %v before the end; output is not streamed", end.Sub(ct.times[0]))
	}
}

func TestExecCancelKills(t *testing.T) {
	c, _ := pair(t, nil)
	dir := t.TempDir()
	marker := filepath.Join(dir, "survived")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"sh", "-c", "sleep 2; touch " + marker}}, guest.ExecIO{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want deadline exceeded", err)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the process outlived its cancelled request")
	}
}

func TestFiles(t *testing.T) {
	c, _ := pair(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	data := make([]byte, 10<<20+123)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sub", "dir", "big.bin")
	n, err := c.WriteFile(ctx, path, 0o600, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(data)) {
		t.Fatalf("wrote %d bytes, want %d", n, len(data))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stat after write: %v %v", fi, err)
	}
	rc, err := c.ReadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("read back %d bytes, hash differs", len(got))
	}

	if _, err := c.ReadFile(ctx, filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("read missing: %v, want fs.ErrNotExist", err)
	}
	if _, err := c.ReadFile(ctx, dir); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("reading a directory: %v, want EISDIR", err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	ents, err := c.ListDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]guest.FileInfo{}
	for _, e := range ents {
		byName[e.Name] = e
	}
	if !fs.FileMode(byName["sub"].Mode).IsDir() || byName["link"].Link != "sub" {
		t.Errorf("listing %+v", ents)
	}
	if _, err := c.ListDir(ctx, filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("list missing: %v", err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Error(err)
	}
	h, err := c.Ping(ctx)
	if err != nil || h.Processes == 0 || h.MemTotal == 0 {
		t.Errorf("ping %+v %v", h, err)
	}
}

// failingReader fails after some bytes, as a broken upload would.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("source broke")
	}
	k := min(len(p), f.n)
	f.n -= k
	return k, nil
}

func TestWriteFileAbortLeavesNothing(t *testing.T) {
	c, _ := pair(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if _, err := c.WriteFile(context.Background(), path, 0o644, &failingReader{n: 100 << 10}); err == nil {
		t.Fatal("upload from a failing reader succeeded")
	}
	// The agent hears of the abort as a reset of the upload's stream, a
	// moment after the host gave up; it may not even have made its
	// temporary file yet when WriteFile returns. So the directory must
	// stay empty for a while, not be empty once (an empty look before the
	// agent began let the temp dir's cleanup race its file, seen in CI).
	deadline := time.Now().Add(5 * time.Second)
	var emptySince time.Time
	for {
		ents, _ := os.ReadDir(dir)
		switch {
		case len(ents) > 0:
			emptySince = time.Time{}
		case emptySince.IsZero():
			emptySince = time.Now()
		case time.Since(emptySince) > 500*time.Millisecond:
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("aborted upload left %v", ents)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOOMKillOnlyOwnSessions(t *testing.T) {
	c, _ := pair(t, nil)
	// Nothing of ours runs: the agent must not pick a host process.
	k, err := c.OOMKill(context.Background())
	if err != nil || k.PID != 0 {
		t.Fatalf("oomkill with no sessions: %+v %v", k, err)
	}
	done := make(chan guest.Exit, 1)
	go func() {
		e, _ := c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"sleep", "30"}}, guest.ExecIO{})
		done <- e
	}()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		k, err = c.OOMKill(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if k.PID != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if k.Name != "sleep" {
		t.Fatalf("killed %+v, want the sleep", k)
	}
	e := <-done
	if !e.OOMKilled || e.Code != 137 {
		t.Fatalf("exit %+v, want OOMKilled 137", e)
	}
}

func TestHome(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, "home:"+r.URL.Path+":"+string(body))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	_, a := pair(t, func(st net.Conn) {
		home, err := net.Dial("unix", sock)
		if err != nil {
			t.Error(err)
			st.Close()
			return
		}
		guest.Splice(st, home)
	})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	go a.ServeHome(tcp)
	for i := range 3 {
		resp, err := http.Post("http://"+tcp.Addr().String()+"/api/x", "text/plain", strings.NewReader("b"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "home:/api/x:b" {
			t.Fatalf("request %d: body %q", i, body)
		}
	}
}

func TestProtocolMismatchRefused(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_ = guest.WriteMessage(b, guest.Hello{Protocol: guest.Protocol + 1, PID: 1}.Message())
		var w agentv1.Welcome
		_ = guest.ReadMessage(b, &w)
		b.Close()
	}()
	if _, err := guest.Accept(a, guest.ClientOptions{}); !errors.Is(err, guest.ErrProtocol) {
		t.Fatalf("accept of a newer agent: %v, want ErrProtocol", err)
	}
}

// TestSecretRequired: an agent that does not hold the sandbox's secret (any
// other process that reaches the agent socket) cannot start a session.
func TestSecretRequired(t *testing.T) {
	secret := []byte("the sandbox's secret")
	for name, agentSecret := range map[string][]byte{"no secret": nil, "wrong secret": []byte("a guess")} {
		t.Run(name, func(t *testing.T) {
			_, _, err := pairWith(t, guest.ClientOptions{Secret: secret}, agentSecret)
			if !errors.Is(err, guest.ErrUnauthenticated) {
				t.Fatalf("handshake: %v, want ErrUnauthenticated", err)
			}
		})
	}
	c, _, err := pairWith(t, guest.ClientOptions{Secret: secret}, secret)
	if err != nil {
		t.Fatalf("handshake with the secret: %v", err)
	}
	if _, err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}
