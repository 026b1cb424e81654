package display

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// fakeTTY is a writer that says it is a terminal.
type fakeTTY struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (f *fakeTTY) IsTerminal() bool { return true }

func (f *fakeTTY) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.b.Write(p)
}

func (f *fakeTTY) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.b.String()
}

func TestIsTerminal(t *testing.T) {
	if !IsTerminal(&fakeTTY{}) {
		t.Error("a writer that says it is a terminal is not one")
	}
	if IsTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is a terminal")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("a regular file is a terminal")
	}
}

func TestNewChooses(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	if _, ok := New(&fakeTTY{}, Options{Logger: logger}).(*Bars); !ok {
		t.Error("a terminal gets no bars")
	}
	if _, ok := New(&fakeTTY{}, Options{Logger: logger, Plain: true}).(*progress.Lines); !ok {
		t.Error("Plain (--json) on a terminal gets no lines")
	}
	if _, ok := New(&bytes.Buffer{}, Options{Logger: logger}).(*progress.Lines); !ok {
		t.Error("a pipe gets no lines")
	}
}

func TestBarsDraw(t *testing.T) {
	tty := &fakeTTY{}
	b := &Bars{W: tty, throttle: time.Nanosecond}
	task := b.Start("uploading a.bin", progress.Bytes, 10<<20)
	task.Update(progress.State{Step: "sending", Detail: "a.bin", Current: 3 << 20})
	// An estimated total can be passed: the bar stays short of full.
	task.Update(progress.State{Step: "sending", Detail: "a.bin", Current: 20 << 20})
	if out := tty.String(); strings.Contains(out, "100%") {
		t.Errorf("full before Done:\n%q", out)
	}
	task.Done(nil)
	out := tty.String()
	for _, want := range []string{"\r", "uploading a.bin: sending: a.bin", "MiB", "30%", "100%", "done in"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("the bar is not left on its own line: %q", out)
	}
	n := len(out)
	task.Update(progress.State{Step: "late"})
	task.Done(nil)
	if len(tty.String()) != n {
		t.Error("drawn after Done")
	}
}

func TestBarsSteps(t *testing.T) {
	tty := &fakeTTY{}
	task := (&Bars{W: tty, throttle: time.Nanosecond}).Start("kernel", progress.Steps, 10)
	task.Update(progress.State{Step: "compiling", Detail: "kernel/fork.o", Current: 3})
	task.Done(errors.New("make failed"))
	out := tty.String()
	for _, want := range []string{"3/10", "kernel: compiling: kernel/fork.o", "failed after"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
}

func TestBarsSpinnerAndQuiet(t *testing.T) {
	tty := &fakeTTY{}
	task := (&Bars{W: tty, throttle: time.Nanosecond}).Start("creating sandbox", progress.Steps, 0)
	task.Update(progress.State{Step: "waiting for the server"})
	time.Sleep(300 * time.Millisecond) // a redraw by the ticker
	task.Done(nil)
	out := tty.String()
	if !strings.Contains(out, "creating sandbox: waiting for the server") || !strings.Contains(out, "done in") || strings.Contains(out, "/-") {
		t.Errorf("spinner output:\n%q", out)
	}

	quiet := &fakeTTY{}
	task = (&Bars{W: quiet, Quiet: time.Hour}).Start("creating sandbox", progress.Steps, 0)
	task.Update(progress.State{Step: "waiting"})
	task.Done(nil)
	if quiet.String() != "" {
		t.Errorf("a task within its quiet time drew: %q", quiet.String())
	}
}
