package progress

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time for the tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = time.Unix(1_000_000, 0).Add(d)
}

// syncBuffer is a buffer the ticker's goroutine and the test may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newLines returns a Lines on a fake clock at 0 whose ticker never fires
// during a test, and the buffer its records go to.
func newLines(quiet time.Duration) (*Lines, *clock, *syncBuffer) {
	c := &clock{}
	c.set(0)
	buf := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	return &Lines{Logger: logger, Quiet: quiet, now: c.now, tick: time.Hour}, c, buf
}

func lines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

func TestLinesRateLimited(t *testing.T) {
	l, c, buf := newLines(0)
	task := l.Start("uploading a.bin", Bytes, 100<<20)
	lt := task.(*lineTask)
	c.set(100 * time.Millisecond)
	task.Update(State{Step: "sending", Detail: "a.bin", Current: 1 << 20}) // new step: a line
	c.set(200 * time.Millisecond)
	task.Update(State{Step: "sending", Detail: "a.bin", Current: 2 << 20}) // +1%: none
	c.set(2 * time.Second)
	task.Update(State{Step: "sending", Detail: "a.bin", Current: 6 << 20}) // +5%: a line
	c.set(10 * time.Second)
	task.Update(State{Step: "sending", Detail: "a.bin", Current: 7 << 20}) // none
	c.set(17 * time.Second)
	lt.tick() // 15 s since the last line: a line
	c.set(20 * time.Second)
	lt.tick() // none
	task.Done(nil)
	task.Done(nil) // once only
	task.Update(State{Step: "late"})

	got := lines(buf.String())
	if len(got) != 5 {
		t.Fatalf("%d lines, want 5 (start, step, +5%%, silence, done):\n%s", len(got), buf.String())
	}
	for _, want := range []struct {
		line int
		has  []string
	}{
		{0, []string{`msg="uploading a.bin"`, `done="0 B"`, `total="100 MiB"`, "percent=0", "elapsed=0s"}},
		{1, []string{"step=sending", "detail=a.bin", `done="1.0 MiB"`, "percent=1", "elapsed=100ms"}},
		{2, []string{`done="6.0 MiB"`, `rate="3.0 MiB/s"`, "percent=6", "eta=31s", "elapsed=2s"}},
		{3, []string{`done="7.0 MiB"`, "elapsed=17s"}},
		{4, []string{"step=done", `done="100 MiB"`, "percent=100", "elapsed=20s"}},
	} {
		for _, h := range want.has {
			if !strings.Contains(got[want.line], h) {
				t.Errorf("line %d lacks %q: %s", want.line, h, got[want.line])
			}
		}
	}
	if strings.Contains(got[4], "eta=") || strings.Contains(buf.String(), "late") {
		t.Errorf("after the end:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), "\r") {
		t.Error("a carriage return in log lines")
	}
}

func TestLinesQuietAndFailure(t *testing.T) {
	l, c, buf := newLines(2 * time.Second)
	// A short wait writes nothing at all.
	short := l.Start("creating sandbox", Steps, 0)
	c.set(time.Second)
	short.Update(State{Step: "waiting"})
	short.(*lineTask).tick()
	short.Done(nil)
	if buf.String() != "" {
		t.Fatalf("a task shorter than Quiet wrote:\n%s", buf.String())
	}

	// A long one shows up once Quiet is over, by its ticker.
	c.set(0)
	long := l.Start("creating sandbox", Steps, 0)
	long.Update(State{Step: "waiting for the server"})
	c.set(2500 * time.Millisecond)
	long.(*lineTask).tick()
	long.Done(errors.New("boom"))
	got := lines(buf.String())
	if len(got) != 1 || !strings.Contains(got[0], `step="waiting for the server"`) || !strings.Contains(got[0], "elapsed=2.5s") {
		t.Fatalf("want one line of the wait, and none for its failure:\n%s", buf.String())
	}
	if strings.Contains(got[0], "total=") || strings.Contains(got[0], "eta=") {
		t.Errorf("an unknown total shown: %s", got[0])
	}
}

func TestLinesPercent(t *testing.T) {
	l, c, buf := newLines(0)
	task := l.Start("building image minimal-0123", Percent, 100)
	c.set(5 * time.Second)
	task.Update(State{Step: "retrieve", Detail: "libc6 50/116", Current: 25})
	task.Update(State{Step: "retrieve", Detail: "zlib1g 51/116", Current: 26})
	task.Done(nil)
	got := lines(buf.String())
	if len(got) != 3 || !strings.Contains(got[1], "percent=25") || !strings.Contains(got[1], `detail="libc6 50/116"`) ||
		!strings.Contains(got[2], "percent=100") {
		t.Fatalf("lines:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), "eta=") {
		t.Errorf("an ETA for a percentage:\n%s", buf.String())
	}
}

func TestRecorderAndDiscard(t *testing.T) {
	var r Recorder
	task := r.Start("x", Steps, 3)
	task.Update(State{Step: "a", Current: 1})
	task.Done(nil)
	task.Update(State{Step: "b"})
	got := r.Snapshot()
	if len(got) != 1 || got[0].Title != "x" || got[0].Total != 3 || len(got[0].States) != 1 || !got[0].Ended {
		t.Fatalf("%+v", got)
	}
	d := Or(nil).Start("y", Bytes, 0)
	d.Update(State{})
	d.Done(nil)
}
