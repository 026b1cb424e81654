package runs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
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

// TestRunLogTagsLines: every line of a run's log is one stream's and
// starts with its tag, however the output is chunked and interleaved; a
// log continued after a restart that ended mid-line starts a new one.
func TestRunLogTagsLines(t *testing.T) {
	dir := t.TempDir()
	r := &Runner{cfg: Config{DataDir: dir}}
	l, err := r.openLog("run_1")
	if err != nil {
		t.Fatal(err)
	}
	out, errw := l.output(streamStdout), l.output(streamStderr)
	for _, w := range []struct {
		w io.Writer
		s string
	}{
		{out, "one\ntw"}, {out, "o\nthree"}, {errw, "oops\n"}, {out, " and more\n"},
		{l.stream("sandboxd"), "note\n"}, {out, "a\n\nb\n"}, {errw, "partial"},
	} {
		if _, err := w.w.Write([]byte(w.s)); err != nil {
			t.Fatal(err)
		}
	}
	const want = "[stdout] one\n[stdout] two\n[stdout] three\n[stderr] oops\n[stdout]  and more\n" +
		"[sandboxd] note\n[stdout] a\n[stdout] \n[stdout] b\n[stderr] partial"
	if b, _ := os.ReadFile(LogPath(dir, "run_1")); string(b) != want {
		t.Fatalf("log:\n%q\nwant\n%q", b, want)
	}
	l.Close()

	l, err = r.openLog("run_1")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.stream("stderr").Write([]byte(" and the rest\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(LogPath(dir, "run_1")); string(b) != want+"\n[stderr]  and the rest\n" {
		t.Fatalf("continued log:\n%q", b)
	}
}

// TestRunLogCountsWhatTheCommandWrote: the log strips escape sequences,
// but counts every byte of the command's streams, as the agent does when
// it replays them after a restart, so nothing is logged twice or lost.
func TestRunLogCountsWhatTheCommandWrote(t *testing.T) {
	dir := t.TempDir()
	r := &Runner{cfg: Config{DataDir: dir}}
	l, err := r.openLog("run_1")
	if err != nil {
		t.Fatal(err)
	}
	const first = "\x1b[32mok\x1b[0m\n" // "ok\n" is kept
	if _, err := l.output(streamStdout).Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if p := readPos(l.posPath); p[0] != uint64(len(first)) {
		t.Fatalf("pos %v, want %d bytes of stdout", p, len(first))
	}
	// Followed again: the agent replays from the start of the stream.
	l, err = r.openLog("run_1")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.resumeAt(runtime.StreamOffsets{})
	if _, err := l.output(streamStdout).Write([]byte(first + "\x1b[1mmore\x1b[0m\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(LogPath(dir, "run_1")); string(b) != "[stdout] ok\n[stdout] more\n" {
		t.Fatalf("log %q", b)
	}
}
