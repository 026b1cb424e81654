package guest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// The hostile agent is this test binary run again with envMode set: a
// separate process that speaks the guest protocol over the same kind of
// unix socket the gVisor runtime uses, and answers like an agent that guest
// root replaced would.
const (
	envMode   = "GUEST_HOSTILE_MODE"
	envSocket = "GUEST_HOSTILE_SOCKET"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envMode); mode != "" {
		hostileAgent(mode, os.Getenv(envSocket))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hostileAgent connects to the host and misbehaves as mode says.
func hostileAgent(mode, sock string) {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		os.Exit(2)
	}
	hello := guest.Hello{Protocol: guest.Protocol, Agent: "hostile", PID: 1, Boot: "b"}
	switch mode {
	case "bad-hello":
		hello.PID = -1
	case "huge-hello":
		hello.Kernel = strings.Repeat("k", 900<<10)
	}
	_ = guest.WriteJSON(conn, guest.FrameHello, hello)
	var w guest.Welcome
	if err := guest.ReadJSON(conn, guest.FrameWelcome, &w); err != nil || w.Error != "" {
		return
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		return
	}
	if mode == "flood-streams" {
		// Open streams home without end and never say what they are.
		for {
			if _, err := sess.OpenStream(); err != nil {
				return
			}
		}
	}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		go answer(mode, st)
	}
}

func answer(mode string, st *yamux.Stream) {
	var req guest.Request
	if err := guest.ReadJSON(st, guest.FrameRequest, &req); err != nil {
		return
	}
	switch mode {
	case "silent":
		time.Sleep(time.Hour) // never answers, keeps the session alive
	case "huge-frame":
		// A frame header that claims 4 GiB, then a slow trickle.
		var hdr [5]byte
		hdr[0] = byte(guest.FrameResult)
		binary.BigEndian.PutUint32(hdr[1:], 0xFFFFFFFF)
		_, _ = st.Write(hdr[:])
		time.Sleep(time.Hour)
	case "invalid":
		switch req.Op {
		case guest.OpListDir:
			ents := make([]guest.FileInfo, guest.MaxListEntries+1)
			for i := range ents {
				ents[i].Name = "f"
			}
			_ = guest.WriteJSON(st, guest.FrameResult, guest.Result{Entries: ents})
		case guest.OpPing:
			_ = guest.WriteJSON(st, guest.FrameResult, guest.Result{Health: &guest.Health{Processes: -5, Uptime: 1}})
		case guest.OpOOMKill:
			_ = guest.WriteJSON(st, guest.FrameResult, guest.Result{Killed: &guest.Killed{PID: -1, Name: "init"}})
		case guest.OpSync:
			_ = guest.WriteJSON(st, guest.FrameResult, guest.Result{Error: "sync failed\n\x1b[2Jlevel=ERROR msg=forged " + strings.Repeat("x", 100<<10)})
		case guest.OpReadFile:
			_ = guest.WriteJSON(st, guest.FrameHeader, guest.FileInfo{Name: "f", Size: -1})
		case guest.OpExec:
			_ = guest.WriteJSON(st, guest.FrameStarted, guest.Started{PID: -7})
		}
	case "traversal":
		_ = guest.WriteJSON(st, guest.FrameResult, guest.Result{Entries: []guest.FileInfo{{Name: "../../etc/shadow"}}})
	case "stalled-read":
		// A file whose content stops after the first frame.
		_ = guest.WriteJSON(st, guest.FrameHeader, guest.FileInfo{Name: "f", Size: 1 << 30})
		_ = guest.WriteFrame(st, guest.FrameData, make([]byte, 1000))
		time.Sleep(time.Hour)
	}
}

// hostile starts the hostile agent in mode and returns the host's end of
// the handshake.
func hostile(t *testing.T, mode string, opts guest.ClientOptions) (*guest.Client, error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envSocket+"="+sock)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c, err := guest.Accept(conn, opts)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// heapGrowth runs f and reports how much the live heap grew.
func heapGrowth(f func()) int64 {
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	f()
	goruntime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

func TestHostileAgentHello(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent greets the host with an invalid pid or a 900 KiB kernel string",
		"the host refuses the session with a protocol error")
	for _, mode := range []string{"bad-hello", "huge-hello"} {
		t.Run(mode, func(t *testing.T) {
			if _, err := hostile(t, mode, guest.ClientOptions{}); !errors.Is(err, guest.ErrProtocol) {
				t.Fatalf("accept: %v, want ErrProtocol", err)
			}
		})
	}
}

func TestHostileAgentSilent(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent accepts every call and never answers (keeping its session alive)",
		"every call fails with ErrNoAnswer after the call timeout, even under a context without deadline")
	const timeout = 300 * time.Millisecond
	c, err := hostile(t, "silent", guest.ClientOptions{CallTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background() // no deadline: the client's own bounds the call
	calls := map[string]func() error{
		"ping":    func() error { _, err := c.Ping(ctx); return err },
		"sync":    func() error { return c.Sync(ctx) },
		"oomkill": func() error { _, err := c.OOMKill(ctx); return err },
		"list":    func() error { _, err := c.ListDir(ctx, "/"); return err },
		"read":    func() error { _, _, err := c.ReadFile(ctx, "/etc/passwd"); return err },
		"write": func() error {
			_, err := c.WriteFile(ctx, "/x", 0o644, strings.NewReader(strings.Repeat("x", 4<<20)))
			return err
		},
		"exec": func() error {
			_, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"true"}}, guest.ExecIO{})
			return err
		},
		"freeze": func() error { return c.Freeze(ctx) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := call()
			if !errors.Is(err, guest.ErrNoAnswer) {
				t.Fatalf("%s: %v, want ErrNoAnswer", name, err)
			}
			if d := time.Since(start); d > 10*timeout {
				t.Errorf("%s returned after %s, timeout %s", name, d, timeout)
			}
		})
	}
}

func TestHostileAgentOversized(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent answers with a frame that claims 4 GiB",
		"the host refuses the frame before allocating it (heap growth under 1 MiB)")
	c, err := hostile(t, "huge-frame", guest.ClientOptions{CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var callErr error
	grew := heapGrowth(func() { _, callErr = c.Ping(context.Background()) })
	if !errors.Is(callErr, guest.ErrProtocol) {
		t.Fatalf("ping: %v, want ErrProtocol", callErr)
	}
	if grew > 1<<20 {
		t.Errorf("heap grew %d bytes on a 4 GiB frame claim", grew)
	}
}

func TestHostileAgentInvalidReplies(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent answers with 8193 entries, negative process counts, pid -1 to kill, negative sizes, a started pid of -7, forged log lines in errors, and ../ entry names",
		"each reply is refused as a protocol error (or its text cleaned and cut to 1 KiB); nothing out of range reaches host code")
	c, err := hostile(t, "invalid", guest.ClientOptions{CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.ListDir(ctx, "/"); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("listing of %d entries: %v", guest.MaxListEntries+1, err)
	}
	if _, err := c.Ping(ctx); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("negative health: %v", err)
	}
	if k, err := c.OOMKill(ctx); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("oom kill of pid -1: %+v %v", k, err)
	}
	if _, _, err := c.ReadFile(ctx, "/f"); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("negative file size: %v", err)
	}
	if _, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"true"}}, guest.ExecIO{}); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("started pid -7: %v", err)
	}
	err = c.Sync(ctx)
	if err == nil || len(err.Error()) > guest.MaxErrorLen+100 || strings.ContainsAny(err.Error(), "\n\x1b") {
		t.Errorf("sync error not cleaned: %d bytes %.200q", len(err.Error()), err)
	}

	tc, err := hostile(t, "traversal", guest.ClientOptions{CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if ents, err := tc.ListDir(ctx, "/"); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("entry named ../../etc/shadow: %v %v", ents, err)
	}
}

func TestHostileAgentStalledTransfer(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent starts a file transfer and stops sending midway",
		"the host's read fails with ErrNoAnswer after the call timeout instead of hanging")
	c, err := hostile(t, "stalled-read", guest.ClientOptions{CallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := c.ReadFile(context.Background(), "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, rc)
	if n != 1000 || !errors.Is(err, guest.ErrNoAnswer) {
		t.Fatalf("read %d bytes, %v; want 1000 and ErrNoAnswer", n, err)
	}
}

func TestHostileAgentStreamFlood(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent opens streams to the host without end and never sends their request",
		"the host holds a bounded number of them (goroutines stay bounded) and its own calls still work")
	base := goruntime.NumGoroutine()
	peak := base
	var c *guest.Client
	grew := heapGrowth(func() {
		var err error
		c, err = hostile(t, "flood-streams", guest.ClientOptions{CallTimeout: 2 * time.Second, Home: func(conn net.Conn) { conn.Close() }})
		if err != nil {
			t.Fatal(err)
		}
		for range 40 {
			time.Sleep(50 * time.Millisecond)
			peak = max(peak, goruntime.NumGoroutine())
		}
	})
	t.Logf("goroutines: %d before the flood, at most %d during it; heap grew %d KiB in 2 s", base, peak, grew>>10)
	if peak > base+maxPending+50 {
		t.Errorf("goroutines grew from %d to %d under a stream flood", base, peak)
	}
	if grew > 32<<20 {
		t.Errorf("heap grew %d MiB in 2 s of stream flood", grew>>20)
	}
	// The host's own calls still go through (the agent answers none, so
	// they end with ErrNoAnswer, not a hang or a dead session).
	if _, err := c.Ping(context.Background()); !errors.Is(err, guest.ErrNoAnswer) {
		t.Errorf("ping during the flood: %v", err)
	}
}

// maxPending is the client's bound on streams that have not sent their
// request (maxPendingAgentStreams).
const maxPending = 64
