package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
	pbfs "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
)

// syncBuffer is a bytes.Buffer for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestProcessOutlivesConnection: the host's session ends in the middle of
// a command (as when sandboxd restarts); the command runs on, and a new
// session attaches to it by tag and receives exactly the output it did
// not have yet, then the end.
func TestProcessOutlivesConnection(t *testing.T) {
	secret := []byte("s")
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	a := agent.New(agent.Options{Version: "test", Cwd: dir, Secret: secret})
	opts := guest.ClientOptions{Secret: secret}
	c1, err := connectAgent(t, a, ln, opts)
	if err != nil {
		t.Fatal(err)
	}
	var first syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := c1.Exec(context.Background(), guest.ExecSpec{
			Cmd: []string{"sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 0.1; done; echo err >&2; exit 3"},
			Tag: "run-1",
		}, guest.ExecIO{Stdout: &first})
		done <- err
	}()
	waitFor(t, func() bool { return strings.Contains(first.String(), "line 2\n") })
	c1.Close() // the host goes away
	if err := <-done; !errors.Is(err, guest.ErrClosed) {
		t.Fatalf("exec on a closed session: %v, want ErrClosed", err)
	}
	had := first.String()
	time.Sleep(300 * time.Millisecond) // output the host misses

	c2, err := connectAgent(t, a, ln, opts)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := c2.Processes(context.Background())
	if err != nil || len(procs) != 1 || procs[0].Tag != "run-1" || procs[0].Cmd[0] != "sh" {
		t.Fatalf("processes after reconnect: %+v %v", procs, err)
	}
	var rest, stderr bytes.Buffer
	var from guest.Offsets
	e, err := c2.Attach(context.Background(), guest.Selector{Tag: "run-1"}, guest.Offsets{Stdout: uint64(len(had))}, false, guest.ExecIO{
		Stdout: &rest, Stderr: &stderr, Started: func(_ int, f guest.Offsets) { from = f },
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != 3 {
		t.Errorf("exit %+v, want code 3", e)
	}
	if from.Stdout != uint64(len(had)) {
		t.Errorf("replay from %d, want %d", from.Stdout, len(had))
	}
	var want strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if got := had + rest.String(); got != want.String() || stderr.String() != "err\n" {
		t.Fatalf("output across the reconnect %q + %q (stderr %q), want %q", had, rest.String(), stderr.String(), want.String())
	}
	// An ended process can still be collected, from the start.
	var again bytes.Buffer
	if e, err := c2.Attach(context.Background(), guest.Selector{Tag: "run-1"}, guest.Offsets{}, false, guest.ExecIO{Stdout: &again}); err != nil || e.Code != 3 || again.String() != want.String() {
		t.Fatalf("attach after the end: %+v %v %q", e, err, again.String())
	}
	if _, err := c2.Attach(context.Background(), guest.Selector{Tag: "nope"}, guest.Offsets{}, false, guest.ExecIO{}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("attach to an unknown tag: %v", err)
	}
}

// TestKillProcessTree: a signal by pid reaches everything the process
// started, not just the process.
func TestKillProcessTree(t *testing.T) {
	c, _ := pair(t, nil)
	pids := make(chan int, 1)
	done := make(chan guest.Exit, 1)
	go func() {
		e, _ := c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"sh", "-c", "sleep 1000 & sleep 1000 & wait"}},
			guest.ExecIO{Started: func(pid int, _ guest.Offsets) { pids <- pid }})
		done <- e
	}()
	pid := <-pids
	waitFor(t, func() bool { return len(session(pid)) == 3 })
	if err := c.Signal(context.Background(), guest.Selector{PID: pid}, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := <-done
	if e.Code != 137 {
		t.Errorf("exit %+v, want 137", e)
	}
	waitFor(t, func() bool { return len(session(pid)) == 0 })
	if err := c.Signal(context.Background(), guest.Selector{PID: pid}, syscall.SIGKILL); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to an ended process: %v, want not found", err)
	}
}

// session lists the live (not zombie) processes of session sid.
func session(sid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 3 && f[0] != "Z" && f[3] == strconv.Itoa(sid) {
			out = append(out, pid)
		}
	}
	return out
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFilesystemService drives the envd-shaped filesystem API the way an
// envd client would, through the session's transport.
func TestFilesystemService(t *testing.T) {
	c, _ := pair(t, nil)
	ctx := context.Background()
	fsc := filesystemconnect.NewFilesystemClient(&http.Client{Transport: c.Transport()}, "http://agent")
	dir := t.TempDir()
	if _, err := fsc.MakeDir(ctx, connect.NewRequest(&pbfs.MakeDirRequest{Path: dir + "/a/b"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fsc.MakeDir(ctx, connect.NewRequest(&pbfs.MakeDirRequest{Path: dir + "/a/b"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("make an existing dir: %v", err)
	}
	if err := os.WriteFile(dir+"/a/b/f.txt", []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	st, err := fsc.Stat(ctx, connect.NewRequest(&pbfs.StatRequest{Path: dir + "/a/b/f.txt"}))
	if err != nil || st.Msg.GetEntry().GetSize() != 5 || st.Msg.GetEntry().GetType() != pbfs.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetPermissions() != "-rw-r-----" {
		t.Fatalf("stat %v %v", st, err)
	}
	ls, err := fsc.ListDir(ctx, connect.NewRequest(&pbfs.ListDirRequest{Path: dir, Depth: 3}))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range ls.Msg.GetEntries() {
		paths = append(paths, strings.TrimPrefix(e.GetPath(), dir))
	}
	if strings.Join(paths, " ") != "/a /a/b /a/b/f.txt" {
		t.Errorf("list depth 3: %v", paths)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := fsc.WatchDir(wctx, connect.NewRequest(&pbfs.WatchDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !watch.Receive() || watch.Msg().GetStart() == nil {
		t.Fatalf("watch start: %v", watch.Err())
	}
	if _, err := fsc.Move(ctx, connect.NewRequest(&pbfs.MoveRequest{Source: dir + "/a/b/f.txt", Destination: dir + "/a/g.txt"})); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 && watch.Receive() {
		if ev := watch.Msg().GetFilesystem(); ev != nil {
			seen[ev.GetType().String()+" "+ev.GetName()] = true
		}
	}
	if !seen["EVENT_TYPE_RENAME a/b/f.txt"] || !seen["EVENT_TYPE_CREATE a/g.txt"] {
		t.Errorf("watch events %v", seen)
	}
	cancel()
	if _, err := fsc.Remove(ctx, connect.NewRequest(&pbfs.RemoveRequest{Path: dir + "/a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fsc.Stat(ctx, connect.NewRequest(&pbfs.StatRequest{Path: dir + "/a"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat removed: %v", err)
	}
}

// BenchmarkRoundTrip measures the protocol's own cost on the host (a unix
// socket, no sandbox): a call that forks nothing, and an exec of true.
// TestFilesystemEnvdAnswers: what the host's E2B front end forwards
// (guest.EnvdHeader) is answered as envd answers, and sandboxd's own calls
// as before: a mode of permission bits alone (not Go's type bits), a
// symbolic link described by its resolved target and that target's
// absolute path (unknown when broken), and a remove of a missing path that
// succeeds.
func TestFilesystemEnvdAnswers(t *testing.T) {
	c, _ := pair(t, nil)
	ctx := context.Background()
	fsc := filesystemconnect.NewFilesystemClient(&http.Client{Transport: c.Transport()}, "http://agent")
	dir := t.TempDir()
	if err := os.Mkdir(dir+"/d", 0o750); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"to-d": "d", "to-to-d": "to-d", "broken": "nowhere"} {
		if err := os.Symlink(target, dir+"/"+link); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(path string, envd bool) *pbfs.EntryInfo {
		t.Helper()
		req := connect.NewRequest(&pbfs.StatRequest{Path: dir + "/" + path})
		if envd {
			req.Header().Set(guest.EnvdHeader, "1")
		}
		st, err := fsc.Stat(ctx, req)
		if err != nil {
			t.Fatalf("stat %s: %v", path, err)
		}
		return st.Msg.GetEntry()
	}
	if e := stat("d", true); e.GetMode() != 0o750 || e.GetType() != pbfs.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("envd: a directory's mode %#o type %v, want 0750 and a directory", e.GetMode(), e.GetType())
	}
	if e := stat("d", false); fs.FileMode(e.GetMode()) != fs.ModeDir|0o750 {
		t.Errorf("sandboxd: a directory's mode %v, want its Go mode", fs.FileMode(e.GetMode()))
	}
	if e := stat("to-to-d", true); e.GetSymlinkTarget() != dir+"/d" || e.GetType() != pbfs.FileType_FILE_TYPE_DIRECTORY || e.GetMode() != 0o750 || !strings.HasPrefix(e.GetPermissions(), "L") {
		t.Errorf("envd: a link to a link to d: target %q type %v mode %#o permissions %s", e.GetSymlinkTarget(), e.GetType(), e.GetMode(), e.GetPermissions())
	}
	if e := stat("to-to-d", false); e.GetSymlinkTarget() != "to-d" || e.GetType() != pbfs.FileType_FILE_TYPE_SYMLINK {
		t.Errorf("sandboxd: a link's own text %q and type %v", e.GetSymlinkTarget(), e.GetType())
	}
	if e := stat("broken", true); e.GetSymlinkTarget() != dir+"/broken" || e.GetType() != pbfs.FileType_FILE_TYPE_UNSPECIFIED {
		t.Errorf("envd: a broken link: target %q type %v", e.GetSymlinkTarget(), e.GetType())
	}
	remove := func(envd bool) error {
		req := connect.NewRequest(&pbfs.RemoveRequest{Path: dir + "/missing"})
		if envd {
			req.Header().Set(guest.EnvdHeader, "1")
		}
		_, err := fsc.Remove(ctx, req)
		return err
	}
	if err := remove(true); err != nil {
		t.Errorf("envd: removing a missing path: %v", err)
	}
	if err := remove(false); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("sandboxd: removing a missing path: %v, want not found", err)
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	c, _ := pair(b, nil)
	ctx := context.Background()
	b.Run("list", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.ListDir(ctx, "/"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exec-true", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"true"}}, guest.ExecIO{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// slowWriter takes its time with every write and once stalls for a
// second, as a slow client on a bad network would.
type slowWriter struct {
	n       int
	stalled bool
}

func (s *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	if s.n > 2<<20 && !s.stalled {
		s.stalled = true
		time.Sleep(time.Second)
	}
	s.n += len(p)
	return len(p), nil
}

// TestSlowConsumerGetsAllOutput: a process that writes more than the
// connection's window and the agent's buffers hold, to a follower that is
// slow and stalls once, loses nothing (the grace after an exit is for
// reads held open by a background child, not for output on its way to a
// slow reader).
func TestSlowConsumerGetsAllOutput(t *testing.T) {
	c, _ := pair(t, nil)
	var w slowWriter
	e, err := c.Exec(context.Background(), guest.ExecSpec{Cmd: []string{"head", "-c", "12000000", "/dev/zero"}}, guest.ExecIO{Stdout: &w})
	if err != nil || e.Code != 0 {
		t.Fatalf("exec: %+v %v", e, err)
	}
	if w.n != 12000000 {
		t.Fatalf("received %d bytes of 12000000", w.n)
	}
}
