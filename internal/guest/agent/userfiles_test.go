package agent_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
	pbfs "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// post sends POST /files?query with body and its content type and
// encoding ("" leaves a header out), as user.
func (s *userSandbox) post(t *testing.T, user string, query url.Values, ctype, encoding string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://agent"+guest.FilesPath+"?"+query.Encode(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	return s.do(t, req, user)
}

// form is a multipart/form-data body of parts {field name, file name
// ("" for a plain field), content}, and its content type.
func form(t *testing.T, parts ...[3]string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, p := range parts {
		var w io.Writer
		var err error
		if p[1] == "" {
			w, err = mw.CreateFormField(p[0])
		} else {
			// CreateFormFile keeps the name's directories, as the SDK's
			// FormData does.
			w, err = mw.CreateFormFile(p[0], p[1])
		}
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, p[2])
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), b.Bytes()
}

func gzipped(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// TestFilesUserPermissions: acting as a user, the kernel checks the
// user's permissions, for every operation, and resolves symlinks as the
// user; without the header the agent is root.
func TestFilesUserPermissions(t *testing.T) {
	s := newUserSandbox(t)
	ctx := context.Background()
	user := [2]uint32{1000, 1000}

	// secret is root's alone (as /root is); shared is root's, writable by
	// the group extra, which user is in as a supplementary group.
	secret := filepath.Join(s.root, "secret")
	shared := filepath.Join(s.root, "shared")
	for d, mode := range map[string]os.FileMode{secret: 0o700, shared: 0o770} {
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	if err := os.Chown(shared, 0, 1234); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "f.txt"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}

	// POST /files: refused in secret (in it and below it), allowed in the
	// home and in shared; root may write in secret.
	for _, p := range []string{secret + "/new.txt", secret + "/f.txt", secret + "/sub/new.txt"} {
		if code, body := s.files(t, "POST", "user", p, "x"); code != http.StatusForbidden || !strings.Contains(body, "permission denied") {
			t.Errorf("post %s as user: %d %s, want 403", p, code, body)
		}
	}
	if got := readFile(t, secret+"/f.txt"); got != "root's" {
		t.Errorf("root's file is now %q", got)
	}
	for _, p := range []string{secret + "/new.txt", secret + "/sub"} {
		if exists(p) {
			t.Errorf("%s made by a refused write", p)
		}
	}
	if code, body := s.files(t, "POST", "user", "mine.txt", "x"); code != http.StatusOK || owner(t, s.home+"/mine.txt") != user {
		t.Errorf("post in the home as user: %d %s", code, body)
	}
	if code, body := s.files(t, "POST", "user", shared+"/g/f.txt", "x"); code != http.StatusOK || owner(t, shared+"/g") != user || owner(t, shared+"/g/f.txt") != user {
		t.Errorf("post in a directory of a supplementary group: %d %s", code, body)
	}
	if code, body := s.files(t, "POST", "", secret+"/sub/root.txt", "x"); code != http.StatusOK || owner(t, secret+"/sub/root.txt") != [2]uint32{0, 0} {
		t.Errorf("post in secret as root: %d %s", code, body)
	}

	// GET /files: the user cannot read root's file.
	if code, body := s.files(t, "GET", "user", secret+"/f.txt", ""); code != http.StatusForbidden {
		t.Errorf("get root's file as user: %d %q", code, body)
	}
	if code, body := s.files(t, "GET", "", secret+"/f.txt", ""); code != http.StatusOK || body != "root's" {
		t.Errorf("get root's file as root: %d %q", code, body)
	}

	// Symlinks in the home are followed as the user: one to secret does
	// not let it write, nor read, there.
	for link, target := range map[string]string{"to-secret": secret, "to-file": secret + "/f.txt"} {
		if err := os.Symlink(target, filepath.Join(s.home, link)); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(s.home, link), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := s.files(t, "POST", "user", "to-secret/evil.txt", "x"); code != http.StatusForbidden || exists(secret+"/evil.txt") {
		t.Errorf("post through a symlink into secret: %d %s", code, body)
	}
	if code, body := s.files(t, "GET", "user", "to-file", ""); code != http.StatusForbidden {
		t.Errorf("get through a symlink to root's file: %d %q", code, body)
	}
	if _, err := s.fs.MakeDir(ctx, as("user", &pbfs.MakeDirRequest{Path: "to-secret/d"})); connect.CodeOf(err) != connect.CodePermissionDenied || exists(secret+"/d") {
		t.Errorf("make dir through a symlink into secret: %v", err)
	}
	// Writing over the symlink replaces the link (rename does not follow
	// it), never root's file.
	if code, body := s.files(t, "POST", "user", "to-file", "mine"); code != http.StatusOK || readFile(t, secret+"/f.txt") != "root's" || owner(t, s.home+"/to-file") != user {
		t.Errorf("post over a symlink to root's file: %d %s", code, body)
	}

	// The filesystem service, likewise.
	for name, call := range map[string]func() error{
		"stat": func() error {
			_, err := s.fs.Stat(ctx, as("user", &pbfs.StatRequest{Path: secret + "/f.txt"}))
			return err
		},
		"list": func() error { _, err := s.fs.ListDir(ctx, as("user", &pbfs.ListDirRequest{Path: secret})); return err },
		"mkdir": func() error {
			_, err := s.fs.MakeDir(ctx, as("user", &pbfs.MakeDirRequest{Path: secret + "/d"}))
			return err
		},
		"remove": func() error {
			_, err := s.fs.Remove(ctx, as("user", &pbfs.RemoveRequest{Path: secret + "/f.txt"}))
			return err
		},
		"move in": func() error {
			_, err := s.fs.Move(ctx, as("user", &pbfs.MoveRequest{Source: "mine.txt", Destination: secret + "/mine.txt"}))
			return err
		},
		"move out": func() error {
			_, err := s.fs.Move(ctx, as("user", &pbfs.MoveRequest{Source: secret + "/f.txt", Destination: "stolen.txt"}))
			return err
		},
		"watch": func() error {
			_, err := s.fs.CreateWatcher(ctx, as("user", &pbfs.CreateWatcherRequest{Path: secret}))
			return err
		},
	} {
		if err := call(); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s in secret as user: %v, want PermissionDenied", name, err)
		}
	}
	if !exists(secret+"/f.txt") || exists(secret+"/d") || exists(secret+"/mine.txt") || exists(s.home+"/stolen.txt") || !exists(s.home+"/mine.txt") {
		t.Error("a refused operation changed something")
	}
	if _, err := s.fs.Remove(ctx, as("user", &pbfs.RemoveRequest{Path: "mine.txt"})); err != nil || exists(s.home+"/mine.txt") {
		t.Errorf("remove in the home as user: %v", err)
	}
	if w, err := s.fs.CreateWatcher(ctx, as("user", &pbfs.CreateWatcherRequest{Path: ".", Recursive: true})); err != nil {
		t.Errorf("watch the home as user: %v", err)
	} else {
		s.fs.RemoveWatcher(ctx, as("user", &pbfs.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()}))
	}
	if _, err := s.fs.ListDir(ctx, as("", &pbfs.ListDirRequest{Path: secret})); err != nil {
		t.Errorf("list secret as root: %v", err)
	}
}

// TestFilesUserFailsClosed: when the thread cannot be given the user's
// credentials (here setresuid(-1) changes nothing, as a kernel that
// ignored the call would), the operation fails; it is never done as root.
func TestFilesUserFailsClosed(t *testing.T) {
	s := newUserSandbox(t)
	pub := filepath.Join(s.root, "pub")
	if err := os.Mkdir(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	if code, body := s.files(t, "POST", "ghost", pub+"/f.txt", "x"); code != http.StatusInternalServerError || !strings.Contains(body, "cannot act as the user") {
		t.Errorf("post as ghost: %d %s", code, body)
	}
	if _, err := s.fs.MakeDir(context.Background(), as("ghost", &pbfs.MakeDirRequest{Path: pub + "/d"})); connect.CodeOf(err) != connect.CodeInternal {
		t.Errorf("make dir as ghost: %v", err)
	}
	if ents, _ := os.ReadDir(pub); len(ents) != 0 {
		t.Errorf("written as ghost: %v", ents)
	}
	// Root by name is the agent's own identity, not a switch that would
	// fail that check: it writes where only root may.
	private := filepath.Join(s.root, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if code, body := s.files(t, "POST", "root", private+"/f.txt", "x"); code != http.StatusOK {
		t.Errorf("post as root into a root-only directory: %d %s", code, body)
	}
}

// TestFilesUserThreadsDoNotLeak: user and root requests at once; each
// file has its requester's owner (a thread with a user's credentials is
// never reused for root's work).
func TestFilesUserThreadsDoNotLeak(t *testing.T) {
	s := newUserSandbox(t)
	pub := filepath.Join(s.root, "pub")
	if err := os.Mkdir(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			user := ""
			if i%2 == 0 {
				user = "user"
			}
			p := fmt.Sprintf("%s/%d/f.txt", pub, i)
			if code, body := s.files(t, "POST", user, p, "x"); code != http.StatusOK {
				t.Errorf("post %s as %q: %d %s", p, user, code, body)
			}
		})
	}
	wg.Wait()
	for i := range 40 {
		want := [2]uint32{0, 0}
		if i%2 == 0 {
			want = [2]uint32{1000, 1000}
		}
		for _, p := range []string{fmt.Sprintf("%s/%d", pub, i), fmt.Sprintf("%s/%d/f.txt", pub, i)} {
			if got := owner(t, p); got != want {
				t.Errorf("%s owned by %v, want %v", p, got, want)
			}
		}
	}
}

// TestFilesMultipart: several files in one multipart body, as the e2b
// SDK's write of a list sends them: each part named "file" is written at
// its file name (relative: in the home), others are skipped, and the
// answer lists every file written.
func TestFilesMultipart(t *testing.T) {
	s := newUserSandbox(t)
	user := [2]uint32{1000, 1000}
	type entry struct {
		Name, Type, Path string
		Size             int64
	}
	decode := func(body string) []entry {
		var out []entry
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("answer %q: %v", body, err)
		}
		return out
	}

	ct, body := form(t, [3]string{"file", "dir/a.txt", "A"}, [3]string{"note", "", "skipped"}, [3]string{"file", s.home + "/b.txt", "BB"}, [3]string{"file", "dir/sub/c.txt", "CCC"})
	code, resp := s.post(t, "user", nil, ct, "", body)
	if code != http.StatusOK {
		t.Fatalf("multipart as user: %d %s", code, resp)
	}
	want := []entry{
		{"a.txt", "file", s.home + "/dir/a.txt", 1},
		{"b.txt", "file", s.home + "/b.txt", 2},
		{"c.txt", "file", s.home + "/dir/sub/c.txt", 3},
	}
	if got := decode(resp); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answer %+v, want %+v", got, want)
	}
	for _, f := range []struct{ path, content string }{{"dir/a.txt", "A"}, {"b.txt", "BB"}, {"dir/sub/c.txt", "CCC"}} {
		p := filepath.Join(s.home, f.path)
		if got := readFile(t, p); got != f.content || owner(t, p) != user {
			t.Errorf("%s: %q owned by %v", p, got, owner(t, p))
		}
	}
	for _, d := range []string{"dir", "dir/sub"} {
		if got := owner(t, filepath.Join(s.home, d)); got != user {
			t.Errorf("%s owned by %v", d, got)
		}
	}

	// Without the header: root's files, relative to root's home.
	ct, body = form(t, [3]string{"file", s.root + "/r1.txt", "1"}, [3]string{"file", s.root + "/r/r2.txt", "2"})
	if code, resp := s.post(t, "", nil, ct, "", body); code != http.StatusOK || len(decode(resp)) != 2 || owner(t, s.root+"/r/r2.txt") != [2]uint32{0, 0} {
		t.Errorf("multipart as root: %d %s", code, resp)
	}

	// The path query parameter wins over the file name.
	ct, body = form(t, [3]string{"file", "ignored.txt", "P"})
	if code, resp := s.post(t, "user", url.Values{"path": {"chosen.txt"}}, ct, "", body); code != http.StatusOK || readFile(t, s.home+"/chosen.txt") != "P" || exists(s.home+"/ignored.txt") {
		t.Errorf("multipart with a path: %d %s", code, resp)
	}

	// Refused: one path twice (the files before it are written), a file
	// without a name, no file at all, a part the user may not write (the
	// ones before it stay).
	ct, body = form(t, [3]string{"file", "dup.txt", "1"}, [3]string{"file", s.home + "/dup.txt", "2"})
	if code, resp := s.post(t, "user", nil, ct, "", body); code != http.StatusBadRequest || readFile(t, s.home+"/dup.txt") != "1" {
		t.Errorf("one path twice: %d %s", code, resp)
	}
	ct, body = form(t, [3]string{"file", "", "x"})
	if code, resp := s.post(t, "user", nil, ct, "", body); code != http.StatusBadRequest {
		t.Errorf("a file without a name: %d %s", code, resp)
	}
	ct, body = form(t, [3]string{"note", "", "x"})
	if code, resp := s.post(t, "user", nil, ct, "", body); code != http.StatusBadRequest {
		t.Errorf("no file: %d %s", code, resp)
	}
	ct, body = form(t, [3]string{"file", "first.txt", "1"}, [3]string{"file", s.root + "/not-yours/x.txt", "2"})
	if code, resp := s.post(t, "user", nil, ct, "", body); code != http.StatusForbidden || !exists(s.home+"/first.txt") || exists(s.root+"/not-yours") {
		t.Errorf("a part the user may not write: %d %s", code, resp)
	}

	// At most 1000 parts.
	parts := make([][3]string, 1001)
	for i := range parts {
		parts[i] = [3]string{"note", "", ""}
	}
	ct, body = form(t, parts...)
	if code, resp := s.post(t, "user", nil, ct, "", body); code != http.StatusBadRequest || !strings.Contains(resp, "1000 parts") {
		t.Errorf("1001 parts: %d %s", code, resp)
	}

	// A body that is not multipart needs the path.
	if code, resp := s.post(t, "user", nil, "application/octet-stream", "", []byte("x")); code != http.StatusBadRequest {
		t.Errorf("octet-stream without a path: %d %s", code, resp)
	}
}

// TestFilesGzip: a gzip body is stored decompressed (single file or
// multipart), bounded by Options.MaxGzipBytes.
func TestFilesGzip(t *testing.T) {
	const max = 1 << 20
	s := newUserSandbox(t, func(o *agent.Options) { o.MaxGzipBytes = max })
	content := bytes.Repeat([]byte("sandboxd "), 1000)

	code, resp := s.post(t, "user", url.Values{"path": {"z.txt"}}, "application/octet-stream", "gzip", gzipped(content))
	if code != http.StatusOK || readFile(t, s.home+"/z.txt") != string(content) || !strings.Contains(resp, fmt.Sprintf(`"size":%d`, len(content))) {
		t.Errorf("gzip upload: %d %s", code, resp)
	}
	ct, body := form(t, [3]string{"file", "zm/1.txt", "one"}, [3]string{"file", "zm/2.txt", "two"})
	if code, resp := s.post(t, "user", nil, ct, "gzip", gzipped(body)); code != http.StatusOK || readFile(t, s.home+"/zm/2.txt") != "two" {
		t.Errorf("gzip multipart upload: %d %s", code, resp)
	}

	// Exactly the bound is allowed; one byte more is refused, and nothing
	// is left behind.
	exact := make([]byte, max)
	if code, resp := s.post(t, "user", url.Values{"path": {"exact.bin"}}, "", "gzip", gzipped(exact)); code != http.StatusOK {
		t.Errorf("gzip of exactly the bound: %d %s", code, resp)
	}
	bomb := gzipped(make([]byte, max+1))
	if code, resp := s.post(t, "user", url.Values{"path": {"bomb.bin"}}, "", "gzip", bomb); code != http.StatusRequestEntityTooLarge {
		t.Errorf("gzip over the bound: %d %s", code, resp)
	}
	if code, resp := s.post(t, "", url.Values{"path": {s.root + "/bomb.bin"}}, "", "gzip", bomb); code != http.StatusRequestEntityTooLarge {
		t.Errorf("gzip over the bound as root: %d %s", code, resp)
	}
	ct, body = form(t, [3]string{"file", "b1.bin", string(make([]byte, max/2))}, [3]string{"file", "b2.bin", string(make([]byte, max/2))})
	if code, resp := s.post(t, "user", nil, ct, "gzip", gzipped(body)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("gzip multipart over the bound in all: %d %s", code, resp)
	}
	ents, _ := os.ReadDir(s.home)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || e.Name() == "bomb.bin" || e.Name() == "b2.bin" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	if exists(s.root + "/bomb.bin") {
		t.Error("bomb.bin written as root")
	}

	// A corrupt stream or another encoding is the caller's mistake.
	bad := gzipped(content)
	bad[len(bad)/2] ^= 0xff
	if code, resp := s.post(t, "user", url.Values{"path": {"bad.txt"}}, "", "gzip", bad); code != http.StatusBadRequest || exists(s.home+"/bad.txt") {
		t.Errorf("corrupt gzip: %d %s", code, resp)
	}
	if code, resp := s.post(t, "user", url.Values{"path": {"notgz.txt"}}, "", "gzip", []byte("plain")); code != http.StatusBadRequest {
		t.Errorf("not gzip: %d %s", code, resp)
	}
	if code, resp := s.post(t, "user", url.Values{"path": {"br.txt"}}, "", "br", []byte("x")); code != http.StatusBadRequest || exists(s.home+"/br.txt") {
		t.Errorf("brotli: %d %s", code, resp)
	}
}

// TestFilesEnvdWriteAsUser: the E2B front end's writes (guest.EnvdHeader)
// make missing parents the user could not make, as envd does (0755, the
// user's), but never through a symbolic link and never below a directory
// the user may not enter; the file itself is still written as the user.
func TestFilesEnvdWriteAsUser(t *testing.T) {
	securitytest.Attack(t, "guest", "an E2B write as the sandbox's user through a symbolic link it planted to a directory only root may enter, and into such a directory directly, to have the agent make directories there",
		"refused with 403; nothing is made there; missing parents elsewhere are made 0755 and the user's, as envd makes them")
	s := newUserSandbox(t)
	secret := filepath.Join(s.root, "secret")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(s.home, "to-secret")); err != nil {
		t.Fatal(err)
	}
	envdPost := func(path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", "http://agent"+guest.FilesPath+"?path="+url.QueryEscape(path), strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(guest.EnvdHeader, "1")
		return s.do(t, req, "user")
	}
	// The test's root directory is root's (0755), as / is.
	made := filepath.Join(s.root, "made", "deeper")
	if code, body := envdPost(made + "/f.txt"); code != http.StatusOK {
		t.Fatalf("envd write below a root-owned directory: %d %s", code, body)
	}
	for _, d := range []string{filepath.Join(s.root, "made"), made, made + "/f.txt"} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 1000 || st.Gid != 1000 || (fi.IsDir() && fi.Mode().Perm() != 0o755) {
			t.Errorf("%s: owner %d:%d mode %v, want the user's (dirs 0755)", d, st.Uid, st.Gid, fi.Mode())
		}
	}
	for _, p := range []string{s.home + "/to-secret/new/f.txt", secret + "/new/f.txt"} {
		if code, body := envdPost(p); code != http.StatusForbidden {
			t.Errorf("envd write %s: %d %s, want 403", p, code, body)
		}
	}
	if ents, _ := os.ReadDir(secret); len(ents) != 0 {
		t.Errorf("made in root's directory: %v", ents)
	}
	// Without the header, sandboxd's own write makes nothing the user
	// could not make itself.
	if code, _ := s.files(t, "POST", "user", filepath.Join(s.root, "plain", "f.txt"), "x"); code != http.StatusForbidden {
		t.Errorf("sandboxd's write below a root-owned directory: %d, want 403", code)
	}
}
