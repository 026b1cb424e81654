package agent_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
	pbfs "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	pbproc "github.com/sandboxd/sandboxd/internal/guest/pb/process"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
)

// userSandbox is an agent whose user database (Options.UserDB) is the
// test's own, so the tests depend on no account of the machine's and
// touch no directory outside their own: user (uid and gid 1000, as in
// sandbox images) has its home in the test's directory and one
// supplementary group, extra (1234).
type userSandbox struct {
	root, home string // the agent's default cwd; user's home
	http       *http.Client
	proc       processconnect.ProcessClient
	fs         filesystemconnect.FilesystemClient
}

func newUserSandbox(t *testing.T, opts ...func(*agent.Options)) *userSandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("acting as a user needs root (setuid, chown): run the tests as root")
	}
	// Not t.TempDir: its directories are 0700, which user could not enter.
	root, err := os.MkdirTemp("", "agent-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	home := filepath.Join(root, "home", "user")
	etc := filepath.Join(root, "etc")
	for _, d := range []string{home, etc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	// ghost's uid is -1 as a uid_t, which setresuid takes as "no change":
	// acting as it must fail, not go on as root.
	passwd := "# test database\nroot:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::" + home + ":/bin/sh\nbroken:x:1001\nghost:x:4294967295:1000::" + home + ":/bin/sh\nhomeless:x:1002:1000::/nonexistent:/bin/sh\n"
	group := "root:x:0:\nuser:x:1000:\nextra:x:1234:root,user\nother:x:1235:someone\n"
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}

	secret := []byte("s")
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	o := agent.Options{Version: "test", Cwd: root, UserDB: etc, Secret: secret}
	for _, f := range opts {
		f(&o)
	}
	a := agent.New(o)
	c, err := connectAgent(t, a, ln, guest.ClientOptions{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: c.Transport()}
	return &userSandbox{
		root: root, home: home, http: hc,
		proc: processconnect.NewProcessClient(hc, "http://agent"),
		fs:   filesystemconnect.NewFilesystemClient(hc, "http://agent"),
	}
}

// as sets the user header on a Connect request ("" leaves it out).
func as[T any](user string, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if user != "" {
		req.Header().Set(guest.UserHeader, user)
	}
	return req
}

// run starts a process as user and returns its output (stdout, or the
// terminal's with its line ends as \n) and its end.
func (s *userSandbox) run(t *testing.T, user string, req *pbproc.StartRequest) (string, *pbproc.ProcessEvent_EndEvent, error) {
	t.Helper()
	stream, err := s.proc.Start(context.Background(), as(user, req))
	if err != nil {
		return "", nil, err
	}
	defer stream.Close()
	var out strings.Builder
	var end *pbproc.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		out.Write(ev.GetData().GetPty())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	return strings.ReplaceAll(out.String(), "\r\n", "\n"), end, stream.Err()
}

const whoami = `id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; pwd`

func TestProcessAsUser(t *testing.T) {
	s := newUserSandbox(t)
	sh := func(script string) *pbproc.ProcessConfig {
		return &pbproc.ProcessConfig{Cmd: "sh", Args: []string{"-c", script}}
	}
	want := "1000\n1000\n1000 1234\n" + s.home + " user user\n" + s.home + "\n"
	for _, tty := range []bool{false, true} {
		req := &pbproc.StartRequest{Process: sh(whoami)}
		if tty {
			req.Pty = &pbproc.PTY{Size: &pbproc.PTY_Size{Rows: 24, Cols: 80}}
		}
		out, end, err := s.run(t, "user", req)
		if err != nil || end.GetExitCode() != 0 || out != want {
			t.Errorf("pty %v: %q %+v %v, want %q", tty, out, end, err, want)
		}
	}

	// The request's environment wins over the user's; a relative cwd is
	// the home's.
	if err := os.Mkdir(filepath.Join(s.home, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := sh(`echo "$HOME $USER"; pwd`)
	cfg.Envs = map[string]string{"HOME": "/elsewhere"}
	cfg.Cwd = new("sub")
	if out, _, err := s.run(t, "user", &pbproc.StartRequest{Process: cfg}); err != nil || out != "/elsewhere user\n"+s.home+"/sub\n" {
		t.Errorf("env and relative cwd: %q %v", out, err)
	}

	// A user whose home does not exist starts in / (login's rule), not in
	// a failure; an explicit relative cwd still names the missing home.
	if out, _, err := s.run(t, "homeless", &pbproc.StartRequest{Process: sh("pwd")}); err != nil || out != "/\n" {
		t.Errorf("homeless user: %q %v", out, err)
	}
	cfg = sh("pwd")
	cfg.Cwd = new("sub")
	if out, end, err := s.run(t, "homeless", &pbproc.StartRequest{Process: cfg}); err != nil || end.GetError() == "" || out != "" {
		t.Errorf("homeless user, relative cwd: %q %+v %v", out, end, err)
	}

	// Without the header: the agent's own user, environment (no LOGNAME)
	// and default cwd.
	if out, _, err := s.run(t, "", &pbproc.StartRequest{Process: sh(whoami)}); err != nil || !strings.HasPrefix(out, "0\n0\n") || !strings.HasSuffix(out, "/root root \n"+s.root+"\n") {
		t.Errorf("no header: %q %v", out, err)
	}

	for _, user := range []string{"nosuch", "broken", "a:b", "-x", "../user", strings.Repeat("u", 33)} {
		if _, end, err := s.run(t, user, &pbproc.StartRequest{Process: sh("touch ran")}); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("user %q: %+v %v, want InvalidArgument", user, end, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.root, "ran")); err == nil {
		t.Error("a process ran for a user that could not be looked up")
	}
}

// owner is the uid and gid of path.
func owner(t *testing.T, path string) [2]uint32 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]uint32{st.Uid, st.Gid}
}

func (s *userSandbox) files(t *testing.T, method, user, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://agent"+guest.FilesPath+"?path="+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return s.do(t, req, user)
}

// do sends req to the agent as user ("": as the agent itself) and answers
// the status and body.
func (s *userSandbox) do(t *testing.T, req *http.Request, user string) (int, string) {
	t.Helper()
	if user != "" {
		req.Header.Set(guest.UserHeader, user)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestFilesAsUser(t *testing.T) {
	s := newUserSandbox(t)
	ctx := context.Background()
	user, root := [2]uint32{1000, 1000}, [2]uint32{0, 0}

	// POST /files: a relative path is the home's; the file and the
	// parents it needed are the user's.
	if code, body := s.files(t, "POST", "user", "a/b/f.txt", "hi"); code != http.StatusOK || !strings.Contains(body, s.home+"/a/b/f.txt") {
		t.Fatalf("post as user: %d %s", code, body)
	}
	for _, p := range []string{"a", "a/b", "a/b/f.txt"} {
		if got := owner(t, filepath.Join(s.home, p)); got != user {
			t.Errorf("%s owned by %v, want %v", p, got, user)
		}
	}
	if got := owner(t, s.home); got != user {
		t.Errorf("home owned by %v", got)
	}
	if code, body := s.files(t, "GET", "user", "a/b/f.txt", ""); code != http.StatusOK || body != "hi" {
		t.Errorf("get as user: %d %q", code, body)
	}
	// Replacing a root's file as the user gives the user the new one.
	if err := os.WriteFile(filepath.Join(s.home, "a", "r.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := s.files(t, "POST", "user", s.home+"/a/r.txt", "y"); code != http.StatusOK || owner(t, filepath.Join(s.home, "a", "r.txt")) != user {
		t.Errorf("replace as user: %d %s", code, body)
	}

	// Without the header: root's, as before.
	if code, body := s.files(t, "POST", "", s.root+"/c/d/f.txt", "hi"); code != http.StatusOK {
		t.Fatalf("post: %d %s", code, body)
	}
	for _, p := range []string{"c", "c/d", "c/d/f.txt"} {
		if got := owner(t, filepath.Join(s.root, p)); got != root {
			t.Errorf("%s owned by %v without the header", p, got)
		}
	}

	// MakeDir and Stat as the user.
	made, err := s.fs.MakeDir(ctx, as("user", &pbfs.MakeDirRequest{Path: "m/n"}))
	if err != nil || made.Msg.GetEntry().GetPath() != s.home+"/m/n" {
		t.Fatalf("make dir as user: %v %v", made, err)
	}
	for _, p := range []string{"m", "m/n"} {
		if got := owner(t, filepath.Join(s.home, p)); got != user {
			t.Errorf("%s owned by %v, want %v", p, got, user)
		}
	}
	if st, err := s.fs.Stat(ctx, as("user", &pbfs.StatRequest{Path: "m"})); err != nil || st.Msg.GetEntry().GetPath() != s.home+"/m" {
		t.Errorf("stat as user: %v %v", st, err)
	}
	if _, err := s.fs.MakeDir(ctx, as("", &pbfs.MakeDirRequest{Path: s.root + "/o/p"})); err != nil || owner(t, s.root+"/o") != root {
		t.Errorf("make dir without the header: %v", err)
	}
	// Move: relative paths are the home's, parents made for the
	// destination the user's.
	if mv, err := s.fs.Move(ctx, as("user", &pbfs.MoveRequest{Source: "a/b/f.txt", Destination: "mv/g.txt"})); err != nil || mv.Msg.GetEntry().GetPath() != s.home+"/mv/g.txt" || owner(t, s.home+"/mv") != user {
		t.Errorf("move as user: %v %v", mv, err)
	}

	// A user that cannot be looked up is refused, and nothing is made.
	if code, body := s.files(t, "POST", "nosuch", "x.txt", "hi"); code != http.StatusBadRequest {
		t.Errorf("post as an unknown user: %d %s", code, body)
	}
	if code, body := s.files(t, "GET", "a:b", s.home+"/a/b/f.txt", ""); code != http.StatusBadRequest {
		t.Errorf("get as a bad user name: %d %s", code, body)
	}
	if _, err := s.fs.MakeDir(ctx, as("nosuch", &pbfs.MakeDirRequest{Path: s.root + "/q"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("make dir as an unknown user: %v", err)
	}
	if _, err := s.fs.ListDir(ctx, as("nosuch", &pbfs.ListDirRequest{Path: s.root})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("list as an unknown user: %v", err)
	}
	for _, p := range []string{s.root + "/q", s.root + "/x.txt", s.home + "/x.txt"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s made for an unknown user", p)
		}
	}
}
