package filecopy

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// dirFS is a sandbox's filesystem played by a host directory: its paths
// are the sandbox's, below root.
type dirFS struct{ root string }

func (d dirFS) host(p string) string { return filepath.Join(d.root, filepath.FromSlash(p)) }

func entryOf(fi fs.FileInfo, link string) Entry {
	return Entry{Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(), Link: link}
}

func (d dirFS) Stat(_ context.Context, p string) (Entry, error) {
	fi, err := os.Lstat(d.host(p))
	if err != nil {
		return Entry{}, err
	}
	link, _ := os.Readlink(d.host(p))
	return entryOf(fi, link), nil
}

func (d dirFS) ListDir(_ context.Context, p string) ([]Entry, error) {
	des, err := os.ReadDir(d.host(p))
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		fi, err := de.Info()
		if err != nil {
			return nil, err
		}
		link, _ := os.Readlink(filepath.Join(d.host(p), de.Name()))
		out = append(out, entryOf(fi, link))
	}
	return out, nil
}

func (d dirFS) ReadFile(_ context.Context, p string) (io.ReadCloser, error) {
	return os.Open(d.host(p))
}

func (d dirFS) WriteFile(_ context.Context, p string, r io.Reader, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(d.host(p)), 0o755); err != nil {
		return err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(d.host(p)); err == nil && fi.IsDir() {
		return fmt.Errorf("write %s: %w", p, syscall.EISDIR)
	}
	return os.WriteFile(d.host(p), data, mode)
}

func (d dirFS) MakeDir(_ context.Context, p string) error {
	if fi, err := os.Lstat(d.host(p)); err == nil && !fi.IsDir() {
		return errdefs.Newf(errdefs.ErrInvalid, "%s is not a directory", p)
	}
	return os.MkdirAll(d.host(p), 0o755)
}

// newSandbox is a dirFS with files: a path ending in "/" is a directory,
// "->" makes a symlink, a "+x" suffix an executable.
func newSandbox(t *testing.T, files ...string) dirFS {
	t.Helper()
	d := dirFS{root: t.TempDir()}
	for _, f := range files {
		switch name, target, isLink := strings.Cut(f, " -> "); {
		case isLink:
			must(t, os.MkdirAll(filepath.Dir(d.host(name)), 0o755))
			must(t, os.Symlink(target, d.host(name)))
		case strings.HasSuffix(f, "/"):
			must(t, os.MkdirAll(d.host(f), 0o755))
		default:
			mode := fs.FileMode(0o644)
			if n, ok := strings.CutSuffix(f, " +x"); ok {
				f, mode = n, 0o755
			}
			must(t, os.MkdirAll(filepath.Dir(d.host(f)), 0o755))
			must(t, os.WriteFile(d.host(f), []byte("content of "+f), mode))
		}
	}
	return d
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// archive is the tar that Walk and WriteTar make of p in fsys.
func archive(t *testing.T, fsys FS, p string, lim Limits) []byte {
	t.Helper()
	a, err := Walk(context.Background(), fsys, p, lim)
	if err != nil {
		t.Fatalf("walk %s: %v", p, err)
	}
	var buf bytes.Buffer
	must(t, a.WriteTar(context.Background(), &buf))
	return buf.Bytes()
}

// names lists a tar's entries as "name type".
func names(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		must(t, err)
		out = append(out, fmt.Sprintf("%s %c", hdr.Name, hdr.Typeflag))
	}
}

// TestRoundTrip: a directory copied out of one sandbox and into another
// arrives with its files, their permission bits and its empty
// directories; its link travels out as a link and is skipped, and said
// so, on the way in.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, "/workspace/proj/a.txt", "/workspace/proj/bin/run +x", "/workspace/proj/empty/", "/workspace/proj/link -> a.txt")
	data := archive(t, src, "proj", DefaultLimits)
	if got, want := names(t, data), []string{"proj/ 5", "proj/a.txt 0", "proj/bin/ 5", "proj/bin/run 0", "proj/empty/ 5", "proj/link 2"}; !slices.Equal(got, want) {
		t.Fatalf("archive %q, want %q", got, want)
	}

	dst := newSandbox(t)
	got, err := Extract(ctx, dst, "/tmp/in", bytes.NewReader(data), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != 2 || got.Directories != 3 || len(got.Skipped) != 1 || !strings.Contains(got.Skipped[0], "proj/link: a symbolic link (to a.txt)") {
		t.Fatalf("extracted %+v", got)
	}
	if b, err := os.ReadFile(dst.host("/tmp/in/proj/a.txt")); err != nil || string(b) != "content of /workspace/proj/a.txt" {
		t.Fatalf("a.txt: %q %v", b, err)
	}
	if fi, err := os.Stat(dst.host("/tmp/in/proj/bin/run")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run: %v %v", fi, err)
	}
	if fi, err := os.Stat(dst.host("/tmp/in/proj/empty")); err != nil || !fi.IsDir() {
		t.Fatalf("empty: %v %v", fi, err)
	}
}

// TestWalkOneFileAndTheRoot: a file's archive is the file under its base
// name; the root's holds its entries without a prefix.
func TestWalkOneFileAndTheRoot(t *testing.T) {
	src := newSandbox(t, "/workspace/notes.md", "/etc/x")
	if got := names(t, archive(t, src, "/workspace/notes.md", DefaultLimits)); !slices.Equal(got, []string{"notes.md 0"}) {
		t.Fatalf("file: %q", got)
	}
	if got := names(t, archive(t, src, "/", DefaultLimits)); !slices.Equal(got, []string{"etc/ 5", "etc/x 0", "workspace/ 5", "workspace/notes.md 0"}) {
		t.Fatalf("root: %q", got)
	}
}

// TestLimits: a copy out past a limit is refused before anything is sent,
// and a copy in stops at the limit.
func TestLimits(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, "/d/a", "/d/b", "/d/c")
	for _, lim := range []Limits{{Bytes: 20, Entries: 100}, {Bytes: 1 << 20, Entries: 3}} {
		if _, err := Walk(ctx, src, "/d", lim); !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("walk within %+v: %v, want too large", lim, err)
		}
	}
	data := archive(t, src, "/d", DefaultLimits)
	for _, lim := range []Limits{{Bytes: 20, Entries: 100}, {Bytes: 1 << 20, Entries: 3}} {
		if _, err := Extract(ctx, newSandbox(t), "/x", bytes.NewReader(data), lim); !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("extract within %+v: %v, want too large", lim, err)
		}
	}
}

// TestExtractStaysInItsDirectory: entries that name a place outside the
// destination are refused, and nothing is written there.
func TestExtractStaysInItsDirectory(t *testing.T) {
	for _, name := range []string{"../escape", "a/../../escape", "/escape"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		must(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}))
		_, _ = tw.Write([]byte("x"))
		must(t, tw.Close())
		dst := newSandbox(t)
		_, err := Extract(context.Background(), dst, "/in", &buf, DefaultLimits)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
		if _, err := os.Stat(dst.host("/escape")); err == nil {
			t.Errorf("%s was written outside the destination", name)
		}
	}
}

// TestCopyErrors: what a caller is told of a path that is missing, a body
// that is not a whole archive, a file that replaces a directory, and a
// file that shrank while it was sent.
func TestCopyErrors(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, "/workspace/a", "/workspace/dir/")
	if _, err := Walk(ctx, src, "missing", DefaultLimits); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "/workspace/missing") {
		t.Errorf("missing: %v", err)
	}
	data := archive(t, src, "a", DefaultLimits)
	if _, err := Extract(ctx, newSandbox(t), "/x", bytes.NewReader(data[:520]), DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("cut archive: %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must(t, tw.WriteHeader(&tar.Header{Name: "dir", Typeflag: tar.TypeReg, Mode: 0o644}))
	must(t, tw.Close())
	if _, err := Extract(ctx, src, "/workspace", &buf, DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "/workspace/dir is a directory") {
		t.Errorf("file over a directory: %v", err)
	}

	a, err := Walk(ctx, src, "a", DefaultLimits)
	must(t, err)
	must(t, os.WriteFile(src.host("/workspace/a"), []byte("x"), 0o644))
	if err := a.WriteTar(ctx, io.Discard); err == nil || !strings.Contains(err.Error(), "shrank") {
		t.Errorf("a file that shrank: %v", err)
	}
}
