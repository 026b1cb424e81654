package agent

import (
	"archive/tar"
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// TestUnpack: directories, files with their modes and symbolic links are
// written under the directory, files already there replaced.
func TestUnpack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "workspace")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := unpackTar(dir, tarOf(t,
		tarEntry{name: ".git/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: ".git/HEAD", typ: tar.TypeReg, mode: 0o644, body: "ref: refs/heads/main\n"},
		tarEntry{name: "README.md", typ: tar.TypeReg, mode: 0o644, body: "new\n"},
		tarEntry{name: "bin/run.sh", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\n"},
		tarEntry{name: "link", typ: tar.TypeSymlink, link: "README.md"},
	), processUmask())
	if err != nil {
		t.Fatal(err)
	}
	if out.Files != 3 || out.Directories != 1 || out.Links != 1 {
		t.Fatalf("unpacked %+v", out)
	}
	for name, want := range map[string]string{".git/HEAD": "ref: refs/heads/main\n", "README.md": "new\n", "link": "new\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v", name, b, err)
		}
	}
	for name, want := range map[string]os.FileMode{"README.md": 0o644, "bin/run.sh": 0o755, "bin": 0o755} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", name, fi.Mode().Perm(), err, want)
		}
	}
}

// TestUnpackStaysInside: no name, and no link an earlier entry made, takes
// a write outside the directory; devices are refused.
func TestUnpackStaysInside(t *testing.T) {
	securitytest.Attack(t, "guest", "the workspace archive (built from the account's repository, which sandboxes push to) names ../escaped, /escaped, a link to .. or to a directory outside and then a file through it, and a device",
		"the agent writes every entry through os.Roots of the workspace directory: each is refused, nothing is written outside")
	for _, tc := range []struct {
		name    string
		entries []tarEntry
	}{
		{"dot-dot", []tarEntry{{name: "../escaped", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"absolute", []tarEntry{{name: "/escaped", typ: tar.TypeReg, mode: 0o644, body: "x"}}},
		{"through a link", []tarEntry{
			{name: "out", typ: tar.TypeSymlink, link: ".."},
			{name: "out/escaped", typ: tar.TypeReg, mode: 0o644, body: "x"},
		}},
		{"through an absolute link", []tarEntry{
			{name: "out", typ: tar.TypeSymlink, link: "PARENT"},
			{name: "out/escaped", typ: tar.TypeReg, mode: 0o644, body: "x"},
		}},
		{"a device", []tarEntry{{name: "null", typ: tar.TypeChar, mode: 0o666}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "workspace")
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "PARENT", parent)
			}
			if _, err := unpackTar(dir, tarOf(t, tc.entries...), processUmask()); err == nil {
				t.Fatal("unpacked")
			}
			if _, err := os.Lstat(filepath.Join(parent, "escaped")); !os.IsNotExist(err) {
				t.Fatalf("a file was written outside the directory: %v", err)
			}
		})
	}
}

// TestUnpackIsTheHosts: a request that acts as a user (every request
// forwarded for E2B's SDK carries one) is refused.
func TestUnpackIsTheHosts(t *testing.T) {
	securitytest.Attack(t, "e2b", "an E2B caller holding a sandbox's access token posts a tar to the agent's unpack endpoint (host-only, as root) to overwrite files as root",
		"the agent refuses a request acting as a user (every forwarded one carries Sandboxd-User), and the E2B host forwards only envd's paths (404)")
	a := New(Options{})
	dir := t.TempDir()
	req := httptest.NewRequest(http.MethodPost, guest.UnpackPath+"?path="+dir, tarOf(t, tarEntry{name: "x", typ: tar.TypeReg, mode: 0o644, body: "x"}))
	req.Header.Set(guest.UserHeader, "root")
	rec := httptest.NewRecorder()
	a.handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("as a user: %d %s", rec.Code, rec.Body)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatalf("x was written: %v", err)
	}
}
