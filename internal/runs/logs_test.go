package runs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestLogsOpen: a run's log is opened from DATA_DIR/runs; a missing one,
// or an id that is not a run's, is fs.ErrNotExist (never a path outside).
func TestLogsOpen(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "runs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(LogPath(dir, "run_1"), []byte("[stdout] hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret.log"), []byte("no"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := Logs{DataDir: dir}
	f, err := l.OpenRunLog("run_1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "[stdout] hi\n" {
		t.Fatalf("read %q", b)
	}
	for _, id := range []string{"run_2", "../secret", "run_/../../secret", ""} {
		if _, err := l.OpenRunLog(id); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%q: %v", id, err)
		}
	}
}
