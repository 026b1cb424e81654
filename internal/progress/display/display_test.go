package display

import (
	"bytes"
	"errors"
	"io"
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

func textLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func TestNewChooses(t *testing.T) {
	tty := &fakeTTY{}
	tr, log := New(tty, Options{NewLogger: textLogger})
	if _, ok := tr.(*Bars); !ok {
		t.Errorf("a terminal gets %T, not bars", tr)
	}
	log.Info("hello")
	if !strings.Contains(tty.String(), "msg=hello") {
		t.Errorf("the logger does not write to the terminal: %q", tty.String())
	}
	tty = &fakeTTY{}
	tr, log = New(tty, Options{NewLogger: textLogger, Plain: true})
	if _, ok := tr.(*progress.Lines); !ok {
		t.Errorf("Plain (--json) on a terminal gets %T, not lines", tr)
	}
	tr.Start("building", progress.Steps, 2).Done(nil)
	log.Info("bye")
	if out := tty.String(); !strings.Contains(out, `msg=building`) || !strings.Contains(out, "msg=bye") || strings.Contains(out, "\r") {
		t.Errorf("lines: %q", out)
	}
	var buf bytes.Buffer
	if tr, _ := New(&buf, Options{}); tr == nil {
		t.Error("no tracker without a logger")
	} else if _, ok := tr.(*progress.Lines); !ok {
		t.Errorf("a pipe gets %T, not lines", tr)
	}
}

// TestBarsLogKeepsLinesOffTheBar: a log line written while a bar shows
// clears the bar's line first and the bar is drawn again after it.
func TestBarsLogKeepsLinesOffTheBar(t *testing.T) {
	tty := &fakeTTY{}
	b := &Bars{W: tty, throttle: time.Nanosecond}
	log := textLogger(b.Log())
	task := b.Start("building image", progress.Percent, 100)
	task.Update(progress.State{Step: "retrieve", Current: 20})
	before := len(tty.String())
	log.Info("a warning")
	task.Done(nil)
	out := tty.String()
	i := strings.Index(out, "time=")
	if i < before {
		t.Fatalf("log line at %d, before the bar (%d bytes):\n%q", i, before, out)
	}
	// Just before the line: the bar's line cleared ("\r", spaces, "\r").
	if cleared := strings.TrimSuffix(out[:i], "\r"); cleared == out[:i] || !strings.HasSuffix(strings.TrimRight(cleared, " "), "\r") {
		t.Errorf("the bar was not cleared before the log line:\n%q", out[:i])
	}
	// After it: the bar again, then its end.
	rest := out[i:]
	nl := strings.Index(rest, "\n")
	if after := rest[nl+1:]; !strings.Contains(after, "20%") || !strings.Contains(after, "building image: retrieve") || !strings.Contains(after, "done in") {
		t.Errorf("the bar was not drawn again after the log line:\n%q", after)
	}
	// Once done, lines are written as they come.
	log.Info("after")
	if !strings.HasSuffix(tty.String(), "msg=after\n") {
		t.Errorf("a line after the end: %q", tty.String())
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
