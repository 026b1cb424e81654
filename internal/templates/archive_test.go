package templates

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// tarOf is a tar of hdrs; a regular file's content is its name
// repeated, unless body says otherwise.
func tarOf(t *testing.T, gz bool, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func reg(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644} }
func dir(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755} }
func sym(name, to string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: to}
}

var lim = archiveLimits{Bytes: 1 << 20, Entries: 100}

// TestCheckArchiveRefusesHostileEntries: traversal, absolute names,
// links that leave the archive, devices and pipes, hard links to
// nothing before them, bombs of bytes and entries, other compressions and
// non-tars are refused with a reason naming the entry; a gzip is read by
// its magic, whatever it is called.
func TestCheckArchiveRefusesHostileEntries(t *testing.T) {
	for _, c := range []struct {
		name  string
		data  []byte
		class error
		words string
	}{
		{"traversal", tarOf(t, false, reg("a/../../etc/passwd")), errdefs.ErrInvalid, `"a/../../etc/passwd": a name with a ".." element, which climbs out (path traversal is refused)`},
		{"absolute", tarOf(t, true, reg("/etc/passwd")), errdefs.ErrInvalid, "an absolute name"},
		{"absolute link", tarOf(t, false, sym("l", "/etc/shadow")), errdefs.ErrInvalid, `a symbolic link to the absolute path "/etc/shadow"`},
		{"link out", tarOf(t, false, sym("a/l", "../../x")), errdefs.ErrInvalid, "outside the copied files"},
		{"hard link out", tarOf(t, false, &tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../x"}), errdefs.ErrInvalid, "a hard link"},
		{"hard link to nothing", tarOf(t, false, &tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "x"}), errdefs.ErrInvalid, "not a file earlier in the archive"},
		{"device", tarOf(t, false, &tar.Header{Typeflag: tar.TypeBlock, Name: "sda"}), errdefs.ErrInvalid, `"sda": a device node`},
		{"pipe", tarOf(t, false, &tar.Header{Typeflag: tar.TypeFifo, Name: "p"}), errdefs.ErrInvalid, "a named pipe"},
		{"bytes", tarOf(t, true, &tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: 2 << 20}), errdefs.ErrTooLarge, "more than 1.0 MiB of files"},
		{"entries", tarOf(t, false, func() []*tar.Header {
			var hs []*tar.Header
			for i := 0; i < 101; i++ {
				hs = append(hs, dir(strings.Repeat("d", i+1)+"/"))
			}
			return hs
		}()...), errdefs.ErrTooLarge, "more than 100 entries"},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0}, errdefs.ErrInvalid, "the archive is zstd"},
		{"not a tar", bytes.Repeat([]byte("hello "), 200), errdefs.ErrInvalid, "not a whole tar archive"},
		{"empty", nil, errdefs.ErrInvalid, "the archive is empty"},
	} {
		_, err := checkArchive(bytes.NewReader(c.data), lim, nil)
		if !errors.Is(err, c.class) || !strings.Contains(errdefs.Message(err, ""), c.words) {
			t.Errorf("%s: %v, want %v with %q", c.name, err, c.class, c.words)
		}
	}
	// A decompression bomb: 64 MiB of zeros in a file, a few KiB gzipped.
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Size: 64 << 20, Mode: 0o644})
	tw.Write(make([]byte, 64<<20))
	tw.Close()
	zw.Close()
	if _, err := checkArchive(bytes.NewReader(bomb.Bytes()), archiveLimits{Bytes: 1 << 20, Entries: 10}, nil); !errors.Is(err, errdefs.ErrTooLarge) || bomb.Len() > 1<<20 {
		t.Errorf("a gzip bomb (%d bytes): %v", bomb.Len(), err)
	}

	good := tarOf(t, true, dir("./"), dir("app/"), reg("app/a.txt"), sym("app/l", "a.txt"), &tar.Header{Typeflag: tar.TypeLink, Name: "app/h", Linkname: "app/a.txt"})
	var names []string
	st, err := checkArchive(bytes.NewReader(good), lim, func(e archiveEntry, _ io.Reader) error {
		names = append(names, e.Name)
		return nil
	})
	if err != nil || st.Entries != 5 || st.Bytes != int64(len("app/a.txt")) || strings.Join(names, " ") != "app app/a.txt app/l app/h" {
		t.Fatalf("a good archive: %+v %v %v", st, names, err)
	}
}

// TestCopyPlan: what a COPY's source matches and where each entry goes
// (Docker's rules: a directory's contents into the destination, a file
// to it or into it).
func TestCopyPlan(t *testing.T) {
	data := tarOf(t, false, dir("app/"), reg("app/main.py"), dir("app/sub/"), reg("app/sub/x"), reg("run.sh"), reg("a.txt"), reg("b.txt"))
	for _, c := range []struct {
		src, dest string
		want      map[string]string // entry -> target ("-": left out)
		intoDir   bool
	}{
		{"app", "/srv/app", map[string]string{"app": "", "app/main.py": "main.py", "app/sub/x": "sub/x", "run.sh": "-"}, true},
		{"run.sh", "/usr/bin/tool", map[string]string{"run.sh": "tool", "app/main.py": "-"}, false},
		{"run.sh", "/usr/bin/", map[string]string{"run.sh": "run.sh"}, true},
		{"*.txt", "/d", map[string]string{"a.txt": "a.txt", "b.txt": "b.txt", "run.sh": "-"}, true},
		{"app/*", "/d", map[string]string{"app/main.py": "main.py", "app/sub": "", "app/sub/x": "x"}, true},
		{".", "/ctx", map[string]string{"app/main.py": "app/main.py", "run.sh": "run.sh"}, true},
	} {
		p, err := planCopy(bytes.NewReader(data), lim, c.src)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		into := p.intoDir(c.dest)
		if c.src == "app/*" {
			into = true // more than one root
		}
		if into != c.intoDir {
			t.Errorf("%s -> %s: into a directory %v", c.src, c.dest, into)
		}
		for name, want := range c.want {
			got, ok := p.target(name, into, "tool")
			if !ok {
				got = "-"
			}
			if got != want {
				t.Errorf("COPY %s %s: %s goes to %q, want %q", c.src, c.dest, name, got, want)
			}
		}
	}
	if _, err := planCopy(bytes.NewReader(data), lim, "nothing*"); err == nil || !strings.Contains(err.Error(), "matches nothing") {
		t.Fatalf("a source that matches nothing: %v", err)
	}
}

// TestCopyOwners: the owner of a COPY that names none is the current
// USER for E2B's JSON steps and root for a Dockerfile's; chown's spec
// takes a user's primary group, a uid's own number.
func TestCopyOwners(t *testing.T) {
	steps := []templatespec.Step{
		{Kind: templatespec.StepCopy},
		{Kind: templatespec.StepUser, User: "app"},
		{Kind: templatespec.StepCopy},
		{Kind: templatespec.StepCopy, Line: 4},
		{Kind: templatespec.StepCopy, User: "web:www"},
	}
	ownerDefaults(steps, "nobody")
	var got []string
	for _, s := range steps {
		if s.Kind == templatespec.StepCopy {
			got = append(got, s.User)
		}
	}
	if strings.Join(got, " ") != "nobody app root web:www" {
		t.Fatalf("owners %v", got)
	}
	for user, want := range map[string]string{"": "", "root": "", "0": "", "app": "app:", "1000": "1000:1000", "app:staff": "app:staff", "root:adm": "root:adm"} {
		if got := chownSpec(user); got != want {
			t.Errorf("chownSpec(%q) = %q, want %q", user, got, want)
		}
	}
	// The owner is part of the cache key: the same COPY owned otherwise
	// is another layer.
	a := []templatespec.Step{{Kind: templatespec.StepCopy, Src: "a", Dest: "/a", FilesHash: strings.Repeat("a", 64), User: "root"}}
	b := []templatespec.Step{{Kind: templatespec.StepCopy, Src: "a", Dest: "/a", FilesHash: strings.Repeat("a", 64), User: "app"}}
	c := []templatespec.Step{{Kind: templatespec.StepCopy, Src: "a", Dest: "/a", FilesHash: strings.Repeat("b", 64), User: "root"}}
	ka, _ := templatespec.CacheKeys("sha256:x", a)
	kb, _ := templatespec.CacheKeys("sha256:x", b)
	kc, _ := templatespec.CacheKeys("sha256:x", c)
	if ka[0] == kb[0] || ka[0] == kc[0] {
		t.Fatal("a COPY's key ignores its owner or its files")
	}
}
