package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPackContext: a context is packed without what its .dockerignore
// names (exceptions put back), reproducibly (the same directory, the same
// hash, whatever the files' times), links kept as links, and a link out
// of the context is refused by name.
func TestPackContext(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"Dockerfile":          "FROM x\n",
		"app/main.py":         "print()\n",
		"app/debug.log":       "noise\n",
		"build/out.bin":       "bin\n",
		"build/keep.txt":      "keep\n",
		"node_modules/m/i.js": "x\n",
		"sub/node_modules/y":  "y\n",
		".dockerignore":       "# comment\n*.log\napp/*.log\nbuild\n!build/keep.txt\n**/node_modules\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("main.py", filepath.Join(dir, "app/link")); err != nil {
		t.Fatal(err)
	}
	a, err := packContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.file.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(a.file)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.IsZero() && h.ModTime.Unix() != 0 || h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s carries a time or an owner: %v %d %q", h.Name, h.ModTime, h.Uid, h.Uname)
		}
		n := h.Name
		if h.Typeflag == tar.TypeSymlink {
			n += "->" + h.Linkname
		}
		names = append(names, n)
	}
	want := ".dockerignore Dockerfile app/ app/link->main.py app/main.py build/keep.txt sub/"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("packed %s\nwant   %s", got, want)
	}
	// Again, after the files' times changed: the same archive.
	later := filepath.Join(dir, "app/main.py")
	tomorrow := time.Now().AddDate(0, 0, 1)
	if err := os.Chtimes(later, tomorrow, tomorrow); err != nil {
		t.Fatal(err)
	}
	b, err := packContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.hash != b.hash || a.size != b.size || a.files != 4 {
		t.Fatalf("packed twice: %s (%d) and %s (%d), %d files", a.hash, a.size, b.hash, b.size, a.files)
	}

	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "app/abs")); err != nil {
		t.Fatal(err)
	}
	if _, err := packContext(dir); err == nil || !strings.Contains(err.Error(), "app/abs is a link to /etc/passwd, outside the context") {
		t.Fatalf("an absolute link: %v", err)
	}
}
