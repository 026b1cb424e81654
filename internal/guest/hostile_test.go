package guest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"

	"github.com/sandboxd/sandboxd/internal/guest"
	pbfs "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	pbproc "github.com/sandboxd/sandboxd/internal/guest/pb/process"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1/agentv1connect"
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
		hello.PID = guest.MaxPID + 1
	case "huge-hello":
		hello.Kernel = strings.Repeat("k", 900<<10)
	}
	_ = guest.WriteMessage(conn, hello.Message())
	var w agentv1.Welcome
	if err := guest.ReadMessage(conn, &w); err != nil || w.GetError() != "" {
		return
	}
	sess, err := yamux.Server(conn, guest.YamuxConfig())
	if err != nil {
		return
	}
	if mode == "flood-streams" {
		// Open streams home without end and never use them.
		for {
			if _, err := sess.OpenStream(); err != nil {
				return
			}
		}
	}
	_ = guest.ServeSession(sess, hostileHandler(mode), slog.New(slog.DiscardHandler))
}

// hostileServices answer the host's calls the way mode says.
type hostileServices struct {
	mode string
	processconnect.UnimplementedProcessHandler
	filesystemconnect.UnimplementedFilesystemHandler
	agentv1connect.UnimplementedAgentHandler
}

func (h hostileServices) ListDir(context.Context, *connect.Request[pbfs.ListDirRequest]) (*connect.Response[pbfs.ListDirResponse], error) {
	if h.mode == "traversal" {
		return connect.NewResponse(&pbfs.ListDirResponse{Entries: []*pbfs.EntryInfo{{Name: "../../etc/shadow"}}}), nil
	}
	ents := make([]*pbfs.EntryInfo, guest.MaxListEntries+1)
	for i := range ents {
		ents[i] = &pbfs.EntryInfo{Name: "f"}
	}
	return connect.NewResponse(&pbfs.ListDirResponse{Entries: ents}), nil
}

func (hostileServices) Health(context.Context, *connect.Request[agentv1.HealthRequest]) (*connect.Response[agentv1.HealthResponse], error) {
	return connect.NewResponse(&agentv1.HealthResponse{UptimeSeconds: 1, MemTotal: -5}), nil
}

func (hostileServices) OOMKill(context.Context, *connect.Request[agentv1.OOMKillRequest]) (*connect.Response[agentv1.OOMKillResponse], error) {
	return connect.NewResponse(&agentv1.OOMKillResponse{Pid: guest.MaxPID + 1, Name: "init"}), nil
}

func (hostileServices) Sync(context.Context, *connect.Request[agentv1.SyncRequest]) (*connect.Response[agentv1.SyncResponse], error) {
	return nil, connect.NewError(connect.CodeInternal, errors.New("sync failed\n\x1b[2Jlevel=ERROR msg=forged "+strings.Repeat("x", 100<<10)))
}

func (hostileServices) Start(_ context.Context, _ *connect.Request[pbproc.StartRequest], st *connect.ServerStream[pbproc.StartResponse]) error {
	return st.Send(&pbproc.StartResponse{Event: &pbproc.ProcessEvent{Event: &pbproc.ProcessEvent_Start{Start: &pbproc.ProcessEvent_StartEvent{Pid: guest.MaxPID + 7}}}})
}

func hostileHandler(mode string) http.Handler {
	switch mode {
	case "silent":
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { time.Sleep(time.Hour) })
	case "huge-message":
		// Every answer claims a message of 4 GiB, then trickles.
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/Start") {
				w.Header().Set("Content-Type", "application/connect+proto")
				w.WriteHeader(http.StatusOK)
				var env [5]byte
				binary.BigEndian.PutUint32(env[1:], 0xFFFFFFFF)
				_, _ = w.Write(env[:])
			} else {
				w.Header().Set("Content-Type", "application/proto")
				w.WriteHeader(http.StatusOK)
				// One buffer written thrice: what the heap measures is
				// the host's, not this fake's own garbage.
				mib := make([]byte, 1<<20)
				for range 3 {
					_, _ = w.Write(mib)
				}
			}
			w.(http.Flusher).Flush()
			time.Sleep(time.Hour)
		})
	case "stalled-read":
		// A file whose content stops after its first thousand bytes.
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
			time.Sleep(time.Hour)
		})
	}
	svc := hostileServices{mode: mode}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(svc))
	mux.Handle(filesystemconnect.NewFilesystemHandler(svc))
	mux.Handle(agentv1connect.NewAgentHandler(svc))
	mux.HandleFunc("GET /files", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"message":"read failed\n\u001b[2Jlevel=ERROR msg=forged `+strings.Repeat("x", 10<<10)+`"}`)
	})
	return mux
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
		"read":    func() error { _, err := c.ReadFile(ctx, "/etc/passwd"); return err },
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
	securitytest.Attack(t, "guest", "a replaced agent answers a call with 3 MiB for one message, and a process stream with a message that claims 4 GiB",
		"the host holds at most MaxMessage of it, discards the rest and gives up by the call timeout (ErrProtocol or ErrNoAnswer; heap growth under 8 MiB)")
	c, err := hostile(t, "huge-message", guest.ClientOptions{CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var pingErr, execErr error
	grew := heapGrowth(func() {
		_, pingErr = c.Ping(context.Background())
		_, execErr = c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"true"}}, guest.ExecIO{})
	})
	// Connect reads on past a message over its limit to find the end of it
	// (bounded by the call timeout), so the failure is either.
	for name, err := range map[string]error{"ping": pingErr, "exec": execErr} {
		if !errors.Is(err, guest.ErrProtocol) && !errors.Is(err, guest.ErrNoAnswer) {
			t.Errorf("%s: %v, want ErrProtocol or ErrNoAnswer", name, err)
		}
	}
	if grew > 8<<20 {
		t.Errorf("heap grew %d bytes on oversized messages", grew)
	}
}

func TestHostileAgentInvalidReplies(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent answers with 8193 entries, negative memory, a pid past pid_max to kill, a started pid past pid_max, forged log lines in errors, and ../ entry names",
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
		t.Errorf("oom kill of a pid past pid_max: %+v %v", k, err)
	}
	if _, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"true"}}, guest.ExecIO{}); !errors.Is(err, guest.ErrProtocol) {
		t.Errorf("started pid past pid_max: %v", err)
	}
	for name, err := range map[string]error{"sync": c.Sync(ctx), "read": func() error { _, err := c.ReadFile(ctx, "/f"); return err }()} {
		if err == nil || len(err.Error()) > guest.MaxErrorLen+100 || strings.ContainsAny(err.Error(), "\n\x1b") {
			t.Errorf("%s error not cleaned: %d bytes %.200q", name, len(err.Error()), err)
		}
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
	rc, err := c.ReadFile(context.Background(), "/f")
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
	securitytest.Attack(t, "guest", "a replaced agent opens streams to the host without end and never uses them",
		"the host takes them at a bounded rate (goroutines stay bounded) and its own calls still work")
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
	// The host may hand out its whole accept burst (400 streams) before
	// a CPU starved by other tests runs their handlers: the bound is that
	// burst, not the flood (an unpaced host would take thousands).
	if peak > base+500 {
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
