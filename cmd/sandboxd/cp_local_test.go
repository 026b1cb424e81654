package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLocalTarRoundTrip: a directory archived here and unpacked under
// another name keeps its files, modes, times, empty directories and links.
func TestLocalTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "proj", "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(src, "proj", "empty"), 0o755))
	must(os.WriteFile(filepath.Join(src, "proj", "a.txt"), []byte("a"), 0o644))
	must(os.WriteFile(filepath.Join(src, "proj", "bin", "run"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("a.txt", filepath.Join(src, "proj", "link")))
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(filepath.Join(src, "proj", "a.txt"), old, old))

	var buf bytes.Buffer
	must(writeLocalTar(&buf, filepath.Join(src, "proj"), "proj", io.Discard))
	dst := t.TempDir()
	got, err := extractLocalTar(&buf, dst, "copy")
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != 2 || got.Directories != 3 || got.Bytes != 11 {
		t.Errorf("unpacked %+v", got)
	}
	if fi, err := os.Stat(filepath.Join(dst, "copy", "bin", "run")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "copy", "a.txt")); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("a.txt: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "copy", "empty")); err != nil || !fi.IsDir() {
		t.Errorf("empty: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "copy", "link")); err != nil || l != "a.txt" {
		t.Errorf("link: %q %v", l, err)
	}
}

// TestExtractLocalTarStaysInside: an archive from a sandbox cannot write
// outside the directory it is unpacked into: not by a name with "..", nor
// through a link it made to somewhere else.
func TestExtractLocalTarStaysInside(t *testing.T) {
	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"dot-dot": {{Name: "x/../../escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
		"link":    {{Name: "x", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "x/escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
		"abs":     {{Name: filepath.Join(outside, "escaped"), Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if h.Size > 0 {
				_, _ = tw.Write([]byte("!"))
			}
		}
		_ = tw.Close()
		if _, err := extractLocalTar(&buf, t.TempDir(), ""); err == nil {
			t.Errorf("%s: unpacked without an error", name)
		}
		if _, err := os.Stat(filepath.Join(outside, "escaped")); err == nil {
			t.Fatalf("%s: wrote outside the destination", name)
		}
	}
}

// TestCpArgs: which argument names a sandbox, and where a copy out goes.
func TestCpArgs(t *testing.T) {
	for in, want := range map[string]cpArg{
		"sbx_1:/tmp/x":  {id: "sbx_1", path: "/tmp/x", remote: true},
		"sbx_1:":        {id: "sbx_1", path: ".", remote: true},
		"./a:b":         {path: "./a:b"},
		"/abs/path":     {path: "/abs/path"},
		"relative/file": {path: "relative/file"},
	} {
		if got := parseCpArg(in); got != want {
			t.Errorf("%q: %+v, want %+v", in, got, want)
		}
	}
	dir := t.TempDir()
	for _, c := range []struct{ src, dst, into, rename string }{
		{"/workspace/out", dir, dir, ""},
		{"/workspace/out", filepath.Join(dir, "new"), dir, "new"},
		{"/workspace/out", filepath.Join(dir, "made") + "/", filepath.Join(dir, "made") + "/", ""},
	} {
		into, rename, err := destinationOut(c.src, c.dst)
		if err != nil || into != c.into || rename != c.rename {
			t.Errorf("%s → %s: %q %q %v, want %q %q", c.src, c.dst, into, rename, err, c.into, c.rename)
		}
	}
	if _, _, err := destinationOut("/x", filepath.Join(dir, "no", "such")); err == nil || !strings.Contains(err.Error(), "no such directory") {
		t.Errorf("into a missing directory: %v", err)
	}
}
