package extents

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestDirRoundTrip: a directory of a sparse file and small files reads
// back the same, the sparse file's holes as holes.
func TestDirRoundTrip(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "checkpoint"), 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"manifest.json": `{"a":1}`, "checkpoint/pages": strings.Repeat("p", 10000), "empty": ""}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(src, "disk.img")
	f, _ := os.Create(disk)
	_ = f.Truncate(64 << 20)
	_, _ = f.WriteAt([]byte("middle"), 32<<20)
	f.Close()
	var buf bytes.Buffer
	if err := WriteDir(&buf, src); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 1<<20 {
		t.Errorf("a 64 MiB sparse file made a stream of %d bytes", buf.Len())
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := ReadDir(&buf, dst, DirLimits{Files: 10, Depth: 1, Bytes: 65 << 20}); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != content {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	a, _ := os.ReadFile(disk)
	b, _ := os.ReadFile(filepath.Join(dst, "disk.img"))
	if !bytes.Equal(a, b) {
		t.Error("disk.img differs")
	}
}

// TestHostileDir: names that leave the directory, go too deep or come
// twice, too many files or bytes, and a symbolic link to write are all
// refused; nothing is written outside the directory.
func TestHostileDir(t *testing.T) {
	securitytest.Attack(t, "cluster",
		"a paused sandbox's state read from the blob store names files outside its directory, too deep or twice, holds too many files or bytes, or is cut short",
		"every such stream is refused before a byte lands outside the directory; a symbolic link is never written into one")
	file := func(name string, size uint64) []byte {
		var b bytes.Buffer
		_ = binary.Write(&b, binary.BigEndian, uint16(len(name)))
		b.WriteString(name)
		_ = binary.Write(&b, binary.BigEndian, size)
		if size > 0 {
			_ = binary.Write(&b, binary.BigEndian, uint64(0))
			_ = binary.Write(&b, binary.BigEndian, size)
			b.Write(bytes.Repeat([]byte{'x'}, int(size)))
		}
		_ = binary.Write(&b, binary.BigEndian, ^uint64(0))
		return b.Bytes()
	}
	end := []byte{0, 0}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	lim := DirLimits{Files: 2, Depth: 1, Bytes: 100}
	for _, c := range []struct {
		name   string
		stream []byte
	}{
		{"dot-dot", cat(file("../x", 1), end)},
		{"absolute", cat(file("/tmp/x", 1), end)},
		{"deep", cat(file("a/b/c", 1), end)},
		{"unclean", cat(file("a//b", 1), end)},
		{"twice", cat(file("a", 1), file("a", 1), end)},
		{"too many", cat(file("a", 1), file("b", 1), file("c", 1), end)},
		{"too big", cat(file("a", 60), file("b", 60), end)},
		{"cut", file("a", 1)},
	} {
		parent := t.TempDir()
		dir := filepath.Join(parent, "in")
		if err := ReadDir(bytes.NewReader(c.stream), dir, lim); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
		if _, err := os.Stat(filepath.Join(parent, "x")); err == nil {
			t.Errorf("%s: wrote outside the directory", c.name)
		}
	}
	if err := ReadDir(bytes.NewReader(cat(file("a", 1), file("b/c", 2), end)), filepath.Join(t.TempDir(), "ok"), lim); err != nil {
		t.Errorf("a good stream: %v", err)
	}
	link := t.TempDir()
	if err := os.Symlink("/etc/passwd", filepath.Join(link, "l")); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(&bytes.Buffer{}, link); err == nil {
		t.Error("a symbolic link was written")
	}
}
