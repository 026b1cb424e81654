package blob

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newTestLocal(t *testing.T) *Local {
	t.Helper()
	l, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readBlob(t *testing.T, l Store, key string) ([]byte, error) {
	rc, err := l.Get(t.Context(), key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func TestLocalLayout(t *testing.T) {
	l := newTestLocal(t)
	content := []byte("hello, blob")
	info, err := l.Put(t.Context(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(l.Dir(), info.Key[:2], info.Key[2:])
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("blob file: %v", err)
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("blob file holds %q", got)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o444 {
		t.Errorf("blob file mode %v, want read-only 0444", perm)
	}
	if entries, _ := os.ReadDir(l.tmpDir()); len(entries) != 0 {
		t.Errorf("temp dir not empty after Put: %v", entries)
	}
}

// Damage to a stored file is reported when the blob is read to its end.
func TestLocalDetectsCorruption(t *testing.T) {
	content := bytes.Repeat([]byte("0123456789abcdef"), 10000)
	tests := []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"flipped byte", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"extended", func(b []byte) []byte { return append(b, 'x') }},
		{"emptied", func(b []byte) []byte { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newTestLocal(t)
			info, err := l.Put(t.Context(), bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			path := l.path(info.Key)
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tt.damage(bytes.Clone(content)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := readBlob(t, l, info.Key); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("reading a damaged blob: %v, want ErrCorrupt", err)
			}
			// Putting the content again repairs it.
			if _, err := l.Put(t.Context(), bytes.NewReader(content)); err != nil {
				t.Fatal(err)
			}
			if tt.name == "flipped byte" {
				// Same size: Put cannot tell the damage from the blob
				// without reading it, and keeps the file.
				return
			}
			if got, err := readBlob(t, l, info.Key); err != nil || !bytes.Equal(got, content) {
				t.Fatalf("after putting the content again: %d bytes, %v", len(got), err)
			}
		})
	}
}

func TestLocalFailedPutLeavesNoTemp(t *testing.T) {
	l := newTestLocal(t)
	r := io.MultiReader(strings.NewReader("some bytes"), errReader{errors.New("boom")})
	if _, err := l.Put(t.Context(), r); err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	err := l.PutKnown(t.Context(), Key([]byte("other")), 5, strings.NewReader("bytes"))
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("PutKnown with a wrong key: %v", err)
	}
	if entries, _ := os.ReadDir(l.tmpDir()); len(entries) != 0 {
		t.Fatalf("temp dir after failed puts: %v", entries)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestNewLocalRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * staleTempAge)
	files := map[string]bool{ // name → should survive
		spoolPrefix + "old":   false,
		spoolPrefix + "fresh": true,
		"not-ours-old":        true,
	}
	for name := range files {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(name, "fresh") {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := NewLocal(dir); err != nil {
		t.Fatal(err)
	}
	for name, survive := range files {
		_, err := os.Stat(filepath.Join(tmp, name))
		if got := err == nil; got != survive {
			t.Errorf("%s: exists = %v, want %v", name, got, survive)
		}
	}
}

func TestLocalListSkipsStrangers(t *testing.T) {
	l := newTestLocal(t)
	info, err := l.Put(t.Context(), strings.NewReader("the only blob"))
	if err != nil {
		t.Fatal(err)
	}
	// Things a person or another program might leave in the directory.
	strangers := []string{
		"README",
		"tmp/" + spoolPrefix + "123",
		info.Key[:2] + "/short",
		info.Key[:2] + "/" + strings.ToUpper(info.Key[2:]),
		"zz/" + info.Key[2:],
		"abc/" + info.Key[3:],
	}
	for _, s := range strangers {
		p := filepath.Join(l.Dir(), s)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := l.List(t.Context(), func(i Info) error { got = append(got, i.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != info.Key {
		t.Fatalf("List = %v, want only %s", got, info.Key)
	}
}

// Putting stored content again moves its time forward, so that a garbage
// collector's grace period counts from the latest Put.
func TestLocalPutRefreshesModified(t *testing.T) {
	l := newTestLocal(t)
	content := []byte("refreshed")
	info, err := l.Put(t.Context(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(l.path(info.Key), old, old); err != nil {
		t.Fatal(err)
	}
	for _, put := range []func() error{
		func() error { _, err := l.Put(t.Context(), bytes.NewReader(content)); return err },
		func() error { return l.PutKnown(t.Context(), info.Key, info.Size, errReader{errors.New("not read")}) },
	} {
		if err := os.Chtimes(l.path(info.Key), old, old); err != nil {
			t.Fatal(err)
		}
		if err := put(); err != nil {
			t.Fatal(err)
		}
		st, err := l.Stat(t.Context(), info.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Modified.After(old.Add(time.Hour)) {
			t.Errorf("Modified = %v after a second Put, want about now", st.Modified)
		}
	}
}

func TestVerifyingReader(t *testing.T) {
	content := []byte("verify me")
	key := Key(content)
	tests := []struct {
		name    string
		data    []byte
		size    int64
		wantErr error
	}{
		{"intact", content, int64(len(content)), nil},
		{"intact, size unknown", content, -1, nil},
		{"other bytes", []byte("verify mE"), int64(len(content)), ErrCorrupt},
		{"short", content[:4], int64(len(content)), ErrCorrupt},
		{"long", append(bytes.Clone(content), '!'), int64(len(content)), ErrCorrupt},
		{"long, size unknown", append(bytes.Clone(content), '!'), -1, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newVerifyingReader(io.NopCloser(bytes.NewReader(tt.data)), key, tt.size)
			_, err := io.ReadAll(v)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("ReadAll = %v, want %v", err, tt.wantErr)
			}
			// The verdict sticks.
			if _, err2 := v.Read(make([]byte, 1)); tt.wantErr != nil && !errors.Is(err2, tt.wantErr) {
				t.Fatalf("Read after the end = %v, want %v", err2, tt.wantErr)
			} else if tt.wantErr == nil && err2 != io.EOF {
				t.Fatalf("Read after the end = %v, want io.EOF", err2)
			}
		})
	}
}

func TestValidKey(t *testing.T) {
	good := Key(nil)
	tests := []struct {
		key  string
		want bool
	}{
		{good, true},
		{strings.Repeat("0", 64), true},
		{strings.Repeat("f", 64), true},
		{"", false},
		{good[:63], false},
		{good + "a", false},
		{strings.Repeat("F", 64), false},
		{strings.Repeat("g", 64), false},
		{"../" + good[3:], false},
		{good[:10] + "/" + good[11:], false},
	}
	for _, tt := range tests {
		if got := ValidKey(tt.key); got != tt.want {
			t.Errorf("ValidKey(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}
