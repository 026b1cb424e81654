package caplog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// check asserts the invariants of a capped file against everything written.
func check(t *testing.T, path string, w *Writer, written []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) > w.max {
		t.Fatalf("file is %d bytes, cap %d", len(got), w.max)
	}
	if int64(len(written)) <= w.max {
		if !bytes.Equal(got, written) {
			t.Fatalf("under the cap the file is not what was written")
		}
		if w.Dropped() != 0 {
			t.Fatalf("dropped %d under the cap", w.Dropped())
		}
		return
	}
	head := w.max / 2
	if !bytes.Equal(got[:head], written[:head]) {
		t.Fatal("head differs")
	}
	d, ok := parseMarker(got[head : head+markerLen])
	if !ok {
		t.Fatalf("no marker after the head: %q", got[head:head+markerLen])
	}
	tail := got[head+markerLen:]
	if !bytes.HasSuffix(written, tail) {
		t.Fatal("tail is not the end of what was written")
	}
	if len(tail) == 0 {
		t.Fatal("empty tail")
	}
	if want := int64(len(written)) - head - int64(len(tail)); d != want || w.Dropped() != want {
		t.Fatalf("marker says %d dropped, Dropped %d, want %d", d, w.Dropped(), want)
	}
}

func TestHeadTailMarker(t *testing.T) {
	for _, chunk := range []int{1, 7, 100, 1000, 5000, 100000} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			w, err := Open(path, 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			var written []byte
			for i := 0; len(written) < 50000; i++ {
				p := bytes.Repeat([]byte{byte('a' + i%26)}, chunk)
				p = append(p, fmt.Sprintf("<%d>", i)...)
				if n, err := w.Write(p); err != nil || n != len(p) {
					t.Fatalf("write: %d %v", n, err)
				}
				written = append(written, p...)
				check(t, path, w, written)
			}
			if !strings.Contains(w.Note(), fmt.Sprint(w.Dropped())) {
				t.Fatalf("note %q does not say how much was dropped", w.Note())
			}
		})
	}
}

func TestUnderCapNoMarker(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := Open(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte("x"), 4096)
	w.Write(p)
	check(t, path, w, p)
	if w.Note() != "" {
		t.Fatalf("note %q with nothing dropped", w.Note())
	}
}

// TestReopen continues a log across writers (a sandboxd restart).
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var written []byte
	for round := range 6 {
		w, err := Open(path, 4096)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			p := []byte(fmt.Sprintf("round %d line %d ........................................................\n", round, i))
			w.Write(p)
			written = append(written, p...)
		}
		check(t, path, w, written)
		w.Close()
	}
}

// TestForeignFileCut opens a file longer than the cap.
func TestForeignFileCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	big := bytes.Repeat([]byte("0123456789"), 10000)
	os.WriteFile(path, big, 0o600)
	w, err := Open(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write([]byte("the end"))
	got, _ := os.ReadFile(path)
	if len(got) > 4096 || !bytes.HasPrefix(got, big[:2048]) || !bytes.HasSuffix(got, []byte("the end")) {
		t.Fatalf("foreign file not cut: %d bytes", len(got))
	}
	if d, _ := parseMarker(got[2048 : 2048+markerLen]); d != int64(len(big))-2048 {
		t.Fatalf("dropped %d", d)
	}
}

func TestConcurrentWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := Open(path, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const writers, each = 8, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := []byte(fmt.Sprintf("writer %d says hello\n", g))
			for range each {
				w.Write(line)
			}
		}()
	}
	wg.Wait()
	var total int64
	for g := range writers {
		total += int64(len(fmt.Sprintf("writer %d says hello\n", g))) * each
	}
	got, _ := os.ReadFile(path)
	if int64(len(got)) > 8192 {
		t.Fatalf("file %d bytes", len(got))
	}
	if kept := int64(len(got)) - markerLen; total-kept != w.Dropped() {
		t.Fatalf("wrote %d, kept %d, dropped %d", total, kept, w.Dropped())
	}
	// Each chunk is written whole: every line in head and tail is intact
	// (but the first of the tail, which may be cut).
	head := string(got[:4096])
	for _, l := range strings.Split(head, "\n")[:4096/22-1] {
		if !strings.HasPrefix(l, "writer ") || !strings.HasSuffix(l, " says hello") {
			t.Fatalf("torn line in head: %q", l)
		}
	}
}

// TestFIFOFlood drains a pipe that another process floods (as runsc or
// QEMU would): the log stays under its cap, and a writer whose reader went
// away neither dies nor blocks.
func TestFIFOFlood(t *testing.T) {
	securitytest.Attack(t, "logs", "a process writes 64 MiB into a drained log pipe, then keeps writing while nobody drains it",
		"the log file stays under its 64 KiB cap with head, tail and the dropped count; with no reader the writer goes on (its writes fail with EAGAIN), it is not killed by SIGPIPE")
	dir := t.TempDir()
	fifo, path := filepath.Join(dir, "out.fifo"), filepath.Join(dir, "out.log")
	if err := MakeFIFO(fifo); err != nil {
		t.Fatal(err)
	}
	wend, err := WriteEnd(fifo)
	if err != nil {
		t.Fatal(err)
	}
	w, err := Open(path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- Drain(ctx, fifo, w) }()

	// A writer that waits for the pipe when it is full (as Go's runtime
	// does with a non-blocking descriptor).
	chunk := make([]byte, 1<<20)
	for range 64 {
		if _, err := wend.Write(chunk); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	if _, err := wend.Write([]byte("THE-END\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.Dropped()+int64(w.max) < 64<<20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	got, _ := os.ReadFile(path)
	if len(got) > 64<<10 || !bytes.HasSuffix(got, []byte("THE-END\n")) {
		t.Fatalf("log is %d bytes, ends %q", len(got), got[max(0, len(got)-20):])
	}
	if want := int64(64<<20+8) - int64(len(got)-markerLen); w.Dropped() != want {
		t.Fatalf("dropped %d, want %d", w.Dropped(), want)
	}

	// The reader goes away (sandboxd stops); a writer keeps writing.
	cancel()
	if err := <-drained; err != context.Canceled {
		t.Fatalf("drain: %v", err)
	}
	// One that does not wait gets EAGAIN once the pipe is full.
	cmd := exec.Command("sh", "-c", "head -c 8M /dev/zero; echo still-alive >&2; exit 3")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = wend, &errb
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 3 || !strings.Contains(errb.String(), "still-alive") {
			t.Fatalf("writer with no reader: %v %q", err, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("writer blocked with no reader")
	}

	// A new reader (sandboxd back) drains again, into the same log.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	w2, err := Open(path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	go func() { _ = Drain(ctx2, fifo, w2) }()
	if _, err := wend.Write([]byte("back-again\n")); err != nil {
		t.Fatal(err)
	}
	wend.Close()
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		got, _ = os.ReadFile(path)
		if bytes.HasSuffix(got, []byte("back-again\n")) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(got) > 64<<10 || !bytes.HasSuffix(got, []byte("back-again\n")) {
		t.Fatalf("after the new reader: %d bytes, ends %q", len(got), got[max(0, len(got)-20):])
	}
}

// TestDefaultAndMinimumCap: a cap of 0 (an unset option) is DefaultSize,
// one below MinSize is MinSize.
func TestDefaultAndMinimumCap(t *testing.T) {
	for _, tc := range []struct{ max, want int64 }{{0, DefaultSize}, {-1, DefaultSize}, {1, MinSize}} {
		w, err := Open(filepath.Join(t.TempDir(), "log"), tc.max)
		if err != nil {
			t.Fatal(err)
		}
		if w.Max() != tc.want {
			t.Errorf("Open(%d): cap %d, want %d", tc.max, w.Max(), tc.want)
		}
		w.Close()
	}
}
