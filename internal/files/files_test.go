package files

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/repo"
)

var (
	pngBytes = append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), bytes.Repeat([]byte{0, 0xff, 0x7f, 0x80}, 300)...)
	pdfBytes = []byte("%PDF-1.4\n%\xe2\xe3\xcf\xd3\nstream\n\x00\x01\x02\xff\nendstream\n%%EOF\n")
)

// fixture is a file service over a fresh repository root, downloading
// from a loopback server that serves a few files.
type fixture struct {
	svc     *Service
	repos   *repo.Manager
	srv     *httptest.Server
	tempDir string
}

type fixtureOpts struct {
	allowPrivate   bool
	maxBytes       int64
	maxUploadBytes int64
	concurrency    int
	access         repo.SubmoduleAccess
}

func newFixture(t *testing.T, o fixtureOpts) fixture {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/notes.txt", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "some notes\n") })
	mux.HandleFunc("/pixel.png", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(pngBytes) })
	mux.HandleFunc("/paper.pdf", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(pdfBytes) })
	mux.HandleFunc("/kilo", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(bytes.Repeat([]byte("k"), 1000)) })
	mux.HandleFunc("/to-metadata", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	repos, err := repo.New(repo.Options{Root: filepath.Join(t.TempDir(), "repos"), Access: o.access})
	if err != nil {
		t.Fatal(err)
	}
	tempDir := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(tempDir, 0o700); err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{
		Repos:          repos,
		Fetcher:        fetch.New(fetch.Options{AllowPrivate: o.allowPrivate, MaxBytes: o.maxBytes}),
		PublicURL:      "http://127.0.0.1:8080/",
		Concurrency:    o.concurrency,
		MaxUploadBytes: o.maxUploadBytes,
		TempDir:        tempDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{svc: svc, repos: repos, srv: srv, tempDir: tempDir}
	t.Cleanup(func() {
		if left, _ := os.ReadDir(tempDir); len(left) != 0 {
			t.Errorf("temporary files left behind: %v", left)
		}
	})
	return f
}

func (f fixture) url(p string) string { return f.srv.URL + p }

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestUpload(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{allowPrivate: true})
	account := uuid.NewString()

	if u, err := f.svc.RepoURL(ctx, account); err != nil || u != "" {
		t.Fatalf("RepoURL before any upload = %q, %v", u, err)
	}
	uploaded, failures, err := f.svc.Upload(ctx, account, Upload{
		Files: []Source{
			{URL: f.url("/notes.txt"), Name: "notes.txt"},
			{URL: f.url("/missing"), Name: "gone.txt"},
			{URL: f.url("/pixel.png"), Name: "pixel.png"},
			{URL: f.url("/paper.pdf"), Name: "paper.pdf"},
			{URL: f.url("/to-metadata"), Name: "creds.json"},
			{URL: "ftp://example.com/x", Name: "ftp.txt"},
		},
		Dir:     "/docs/in/",
		Message: "Add research files",
	})
	if err != nil {
		t.Fatal(err)
	}
	wantFailures := []string{
		"gone.txt: HTTP 404",
		"creds.json: address not allowed",
		"ftp.txt: only http and https URLs are allowed",
	}
	if strings.Join(failures, "|") != strings.Join(wantFailures, "|") {
		t.Fatalf("failures %q, want %q", failures, wantFailures)
	}
	var paths []string
	for _, u := range uploaded {
		paths = append(paths, u.Path)
	}
	if strings.Join(paths, " ") != "docs/in/notes.txt docs/in/pixel.png docs/in/paper.pdf" {
		t.Fatalf("uploaded %v", paths)
	}

	repoPath, _ := f.repos.Path(account)
	if n := git(t, repoPath, "rev-list", "--count", "main"); n != "1" {
		t.Fatalf("%s commits, want one", n)
	}
	if msg := git(t, repoPath, "log", "-1", "--format=%s", "main"); msg != "Add research files" {
		t.Fatalf("commit message %q", msg)
	}
	for _, u := range uploaded {
		if sha := git(t, repoPath, "rev-parse", "main:"+u.Path); sha != u.SHA {
			t.Fatalf("%s: sha %s, git says %s", u.Path, u.SHA, sha)
		}
	}
	// Binary files come back byte for byte.
	for p, want := range map[string][]byte{"docs/in/pixel.png": pngBytes, "docs/in/paper.pdf": pdfBytes, "docs/in/notes.txt": []byte("some notes\n")} {
		got, err := f.svc.Read(ctx, account, p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Read(%s): %d bytes, %v", p, len(got), err)
		}
	}
	if u, err := f.svc.RepoURL(ctx, account); err != nil || u != "http://127.0.0.1:8080/git/"+account+".git" {
		t.Fatalf("RepoURL = %q, %v", u, err)
	}

	// The default message, and a second upload on top of the first.
	if _, _, err := f.svc.Upload(ctx, account, Upload{Files: []Source{{URL: f.url("/notes.txt"), Name: "top.txt"}}}); err != nil {
		t.Fatal(err)
	}
	if msg := git(t, repoPath, "log", "-1", "--format=%s", "main"); msg != DefaultMessage {
		t.Fatalf("default message %q", msg)
	}
	if _, err := f.svc.Read(ctx, account, "docs/in/pixel.png"); err != nil {
		t.Fatalf("first upload lost: %v", err)
	}
}

func TestUploadAllFail(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{}) // loopback not allowed
	account := uuid.NewString()
	uploaded, failures, err := f.svc.Upload(ctx, account, Upload{Files: []Source{
		{URL: f.url("/notes.txt"), Name: "a.txt"},
		{URL: "http://169.254.169.254/latest/meta-data/", Name: "b.txt"},
		{URL: "http://[::1]:1/x", Name: "c.txt"},
	}})
	if err != nil || len(uploaded) != 0 {
		t.Fatalf("uploaded %v, %v", uploaded, err)
	}
	want := "a.txt: address not allowed|b.txt: address not allowed|c.txt: address not allowed"
	if strings.Join(failures, "|") != want {
		t.Fatalf("failures %q", failures)
	}
	// Nothing committed: not even a repository was made.
	if ok, _ := f.repos.Exists(ctx, account); ok {
		t.Fatal("a failed upload created a repository")
	}
}

func TestUploadLimitsAndNames(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		opts     fixtureOpts
		files    func(f fixture) []Source
		uploaded []string
		failures []string
	}{
		{
			name: "per-file cap",
			opts: fixtureOpts{allowPrivate: true, maxBytes: 999},
			files: func(f fixture) []Source {
				return []Source{{URL: f.url("/kilo"), Name: "k"}, {URL: f.url("/notes.txt"), Name: "n"}}
			},
			uploaded: []string{"n"},
			failures: []string{"k: larger than 999 bytes"},
		},
		{
			name: "upload budget",
			opts: fixtureOpts{allowPrivate: true, maxUploadBytes: 1500, concurrency: 1},
			files: func(f fixture) []Source {
				return []Source{{URL: f.url("/kilo"), Name: "k1"}, {URL: f.url("/kilo"), Name: "k2"}, {URL: f.url("/notes.txt"), Name: "n"}}
			},
			uploaded: []string{"k1", "n"},
			failures: []string{"k2: upload larger than 1500 bytes in total"},
		},
		{
			name: "names",
			opts: fixtureOpts{allowPrivate: true},
			files: func(f fixture) []Source {
				u := f.url("/notes.txt")
				return []Source{{URL: u, Name: "ok.txt"}, {URL: u, Name: "../up"}, {URL: u, Name: "a/b"}, {URL: u, Name: ".git"},
					{URL: u, Name: "ok.txt"}, {URL: u, Name: ".."}, {URL: u, Name: `a\b`}, {URL: u, Name: ""}}
			},
			uploaded: []string{"ok.txt"},
			failures: []string{"../up: invalid file name", "a/b: invalid file name", ".git: invalid file name",
				"ok.txt: file name given more than once", "..: invalid file name", `a\b: invalid file name`, ": invalid file name"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.opts)
			uploaded, failures, err := f.svc.Upload(ctx, uuid.NewString(), Upload{Files: tc.files(f)})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, u := range uploaded {
				got = append(got, u.Path)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.uploaded) || fmt.Sprint(failures) != fmt.Sprint(tc.failures) {
				t.Fatalf("uploaded %q failures %q; want %q and %q", got, failures, tc.uploaded, tc.failures)
			}
		})
	}
}

func TestUploadRefusals(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{allowPrivate: true})
	account := uuid.NewString()
	if _, _, err := f.svc.Upload(ctx, account, Upload{Files: []Source{{URL: f.url("/notes.txt"), Name: "docs"}}}); err != nil {
		t.Fatal(err)
	}
	many := make([]Source, 101)
	for i := range many {
		many[i] = Source{URL: f.url("/notes.txt"), Name: fmt.Sprint(i)}
	}
	cases := []struct {
		name string
		req  Upload
		msg  string
	}{
		{"no files", Upload{}, "At least one file is required"},
		{"too many", Upload{Files: many}, "At most 100 files can be uploaded at once"},
		{"escaping path", Upload{Files: many[:1], Dir: "a/../../b"}, "path must stay inside the repository"},
		{".git path", Upload{Files: many[:1], Dir: ".git/hooks"}, "path must stay inside the repository"},
		{"into a file", Upload{Files: many[:1], Dir: "docs"}, "Cannot write into docs: a file, directory or submodule there is in the way"},
		{"over a directory", Upload{Files: []Source{{URL: f.url("/notes.txt"), Name: "x"}}, Dir: "docs/x"}, "Cannot write into docs/x: a file, directory or submodule there is in the way"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := f.svc.Upload(ctx, account, tc.req)
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Message(err, "") != tc.msg {
				t.Fatalf("err = %v, want %q", err, tc.msg)
			}
		})
	}
}

func TestTreeAndRead(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{allowPrivate: true})
	account := uuid.NewString()

	if _, _, err := f.svc.Tree(ctx, account); !errors.Is(err, errdefs.ErrNoRepository) {
		t.Fatalf("Tree without a repository: %v", err)
	}
	if _, err := f.svc.Read(ctx, account, "x"); !errors.Is(err, errdefs.ErrNoRepository) {
		t.Fatalf("Read without a repository: %v", err)
	}
	if _, err := f.repos.Ensure(ctx, account); err != nil {
		t.Fatal(err)
	}
	if tree, _, err := f.svc.Tree(ctx, account); err != nil || tree == nil || len(tree) != 0 {
		t.Fatalf("Tree of an empty repository = %#v, %v", tree, err)
	}
	if _, err := f.svc.Read(ctx, account, "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Read in an empty repository: %v", err)
	}

	sub := uuid.NewString()
	subCommit, _, err := f.repos.CommitFiles(ctx, sub, repo.MainBranch, []repo.File{repo.BytesFile("s.txt", []byte("s"))}, "s", repo.Signature{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.svc.Upload(ctx, account, Upload{Files: []Source{{URL: f.url("/pixel.png"), Name: "pixel.png"}}, Dir: "img"}); err != nil {
		t.Fatal(err)
	}
	addGitlink(t, f.repos, account, "lib/sub", "../"+sub+".git", subCommit)

	tree, _, err := f.svc.Tree(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range tree {
		size := "-"
		if e.Size != nil {
			size = fmt.Sprint(*e.Size)
		}
		got = append(got, e.Path+" "+e.Type+" "+size)
		if len(e.SHA) != 40 {
			t.Fatalf("%s has sha %q", e.Path, e.SHA)
		}
	}
	sort.Strings(got)
	mods := fmt.Sprint(len("[submodule \"lib/sub\"]\n\tpath = lib/sub\n\turl = ../" + sub + ".git\n"))
	want := []string{".gitmodules blob " + mods, "img tree -", "img/pixel.png blob " + fmt.Sprint(len(pngBytes)), "lib tree -", "lib/sub tree -"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, missing := range []string{"img", "nope", "lib/sub", "lib/sub/s.txt"} {
		// lib/sub/s.txt is another account's repository and this fixture
		// has no access rule: not found.
		if _, err := f.svc.Read(ctx, account, missing); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Read(%s) = %v, want not found", missing, err)
		}
	}
}

func TestUploadIntoSubmodule(t *testing.T) {
	ctx := context.Background()
	allow := repo.AccessFunc(func(context.Context, string, string, repo.Use) (bool, error) { return true, nil })
	f := newFixture(t, fixtureOpts{allowPrivate: true, access: allow})
	account, org := uuid.NewString(), uuid.NewString()
	orgCommit, _, err := f.repos.CommitFiles(ctx, org, repo.MainBranch, []repo.File{repo.BytesFile("README.md", []byte("org"))}, "org", repo.Signature{})
	if err != nil {
		t.Fatal(err)
	}
	addGitlink(t, f.repos, account, "orgs/acme", "../"+org+".git", orgCommit)

	uploaded, failures, err := f.svc.Upload(ctx, account, Upload{
		Files:   []Source{{URL: f.url("/paper.pdf"), Name: "paper.pdf"}},
		Dir:     "orgs/acme/papers",
		Message: "Share a paper",
	})
	if err != nil || len(failures) != 0 || len(uploaded) != 1 || uploaded[0].Path != "orgs/acme/papers/paper.pdf" {
		t.Fatalf("uploaded %v, failures %v, %v", uploaded, failures, err)
	}
	orgPath, _ := f.repos.Path(org)
	if sha := git(t, orgPath, "rev-parse", "main:papers/paper.pdf"); sha != uploaded[0].SHA {
		t.Fatalf("sha in the org's repository %s, reported %s", sha, uploaded[0].SHA)
	}
	if msg := git(t, orgPath, "log", "-1", "--format=%s", "main"); msg != "Share a paper" {
		t.Fatalf("org commit %q", msg)
	}
	got, err := f.svc.Read(ctx, account, "orgs/acme/papers/paper.pdf")
	if err != nil || !bytes.Equal(got, pdfBytes) {
		t.Fatalf("Read through the submodule: %d bytes, %v", len(got), err)
	}
}

// addGitlink records commit of the repository at url as a submodule at p
// of account's repository, with the git client.
func addGitlink(t *testing.T, repos *repo.Manager, account, p, url, commit string) {
	t.Helper()
	repoPath, err := repos.Ensure(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	wt := t.TempDir()
	git(t, wt, "clone", "-q", repoPath, ".")
	mods := "[submodule \"" + p + "\"]\n\tpath = " + p + "\n\turl = " + url + "\n"
	if err := os.WriteFile(filepath.Join(wt, ".gitmodules"), []byte(mods), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, wt, "update-index", "--add", "--cacheinfo", "160000,"+commit+","+p)
	git(t, wt, "add", ".gitmodules")
	git(t, wt, "commit", "-q", "-m", "add submodule")
	git(t, wt, "push", "-q", "origin", "HEAD:main")
}

// multipartRequest builds a multipart/form-data body of fields and files
// (name → content; a name starting with "!" is sent without one).
func multipartRequest(t *testing.T, fields map[string]string, files [][2]string) *multipart.Reader {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for k, v := range fields {
		if err := mw.WriteField(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		name := f[0]
		var w interface{ Write([]byte) (int, error) }
		var err error
		if strings.HasPrefix(name, "!") {
			w, err = mw.CreateFormField("file")
		} else {
			w, err = mw.CreateFormFile("file", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return multipart.NewReader(&body, mw.Boundary())
}

func TestUploadMultipart(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{maxBytes: 5000})
	account := uuid.NewString()

	r := multipartRequest(t, map[string]string{"path": "assets", "message": "Upload from a form"}, [][2]string{
		{"pixel.png", string(pngBytes)},
		{"huge.bin", strings.Repeat("h", 5001)},
		{"paper.pdf", string(pdfBytes)},
		{"../evil", "x"},
	})
	uploaded, failures, err := f.svc.UploadMultipart(ctx, account, r)
	if err != nil {
		t.Fatal(err)
	}
	// Go's multipart reader keeps only the base name of a file name.
	if fmt.Sprint(failures) != "[huge.bin: larger than 5000 bytes]" {
		t.Fatalf("failures %q", failures)
	}
	var paths []string
	for _, u := range uploaded {
		paths = append(paths, u.Path)
	}
	if fmt.Sprint(paths) != "[assets/pixel.png assets/paper.pdf assets/evil]" {
		t.Fatalf("uploaded %v", paths)
	}
	if got, _ := f.svc.Read(ctx, account, "assets/pixel.png"); !bytes.Equal(got, pngBytes) {
		t.Fatal("pixel.png changed on its way")
	}
	repoPath, _ := f.repos.Path(account)
	if msg := git(t, repoPath, "log", "-1", "--format=%s", "main"); msg != "Upload from a form" {
		t.Fatalf("commit message %q", msg)
	}

	cases := []struct {
		name string
		req  *multipart.Reader
		msg  string
	}{
		{"no files", multipartRequest(t, map[string]string{"path": "x"}, nil), "At least one file is required"},
		{"file without a name", multipartRequest(t, nil, [][2]string{{"!", "x"}}), "Each file must have a name"},
		{"escaping path", multipartRequest(t, map[string]string{"path": "../x"}, [][2]string{{"a", "x"}}), "path must stay inside the repository"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := f.svc.UploadMultipart(ctx, account, tc.req)
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Message(err, "") != tc.msg {
				t.Fatalf("err = %v, want %q", err, tc.msg)
			}
		})
	}
}
