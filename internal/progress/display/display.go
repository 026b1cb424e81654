// Package display decides how a command shows progress: bars redrawn in
// place when it writes to a terminal, log lines (progress.Lines) anywhere
// else — pipes, files, CI logs, and whenever the command prints JSON. It is
// the one place that knows about terminals; the operations that report
// only know package progress.
package display

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// Options say where progress goes.
type Options struct {
	// Plain asks for log lines even on a terminal: set it when the
	// command's output is for machines (--json, a JSON log format).
	Plain bool
	// NewLogger makes the command's logger, writing to the writer it is
	// given; the lines go through it (nil: no lines).
	NewLogger func(io.Writer) *slog.Logger
	// Interval and Quiet are progress.Lines's.
	Interval, Quiet time.Duration
}

// New returns the Tracker for a command that writes its progress to w
// (its stderr), and the logger for the rest of what it writes there: bars
// drawn on w when w is a terminal and o.Plain is not set, with a logger
// whose lines move the bar out of their way (Bars.Log); else log lines
// through the logger, which writes to w.
func New(w io.Writer, o Options) (progress.Tracker, *slog.Logger) {
	newLogger := o.NewLogger
	if newLogger == nil {
		newLogger = func(io.Writer) *slog.Logger { return slog.New(slog.DiscardHandler) }
	}
	if !o.Plain && IsTerminal(w) {
		b := &Bars{W: w, Quiet: o.Quiet}
		return b, newLogger(b.Log())
	}
	log := newLogger(w)
	return &progress.Lines{Logger: log, Interval: o.Interval, Quiet: o.Quiet}, log
}

// Terminal is implemented by writers that know whether they are a
// terminal better than their file descriptor says (wrappers, tests).
type Terminal interface {
	IsTerminal() bool
}

// IsTerminal reports whether w is a terminal a bar can be redrawn on: a
// Terminal that says so, or a file whose descriptor is a terminal, unless
// TERM is "dumb" (an editor's shell buffer, which prints carriage returns).
func IsTerminal(w io.Writer) bool {
	if t, ok := w.(Terminal); ok {
		return t.IsTerminal()
	}
	f, ok := w.(interface{ Fd() uintptr })
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false
	}
	return os.Getenv("TERM") != "dumb"
}

// Bars is the Tracker for a terminal: a bar per task, redrawn in place on W
// (with its count or bytes, rate and time left when the total is known; a
// spinner with the step when it is not), left on its own line when the
// task ends.
type Bars struct {
	W io.Writer
	// Quiet, when set, holds a task's bar back this long, so that a wait
	// that is usually short draws nothing.
	Quiet time.Duration
	// throttle is the shortest time between two draws (default 100 ms).
	throttle time.Duration

	mu     sync.Mutex
	active []*barTask // the tasks not done, whose bars Log moves
}

// Log returns a writer for what else the command writes to W (its log):
// each write clears the bars' line first and draws them again after, so
// that a line never lands in the middle of a bar and the bar stays below
// the last line.
func (b *Bars) Log() io.Writer { return barLog{b} }

type barLog struct{ b *Bars }

func (l barLog) Write(p []byte) (int, error) {
	b := l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	// The tasks stay locked from the clearing to the drawing, so that no
	// draw of theirs comes between.
	for _, t := range b.active {
		t.mu.Lock()
		if t.bar != nil && !t.ended {
			_ = t.bar.Clear()
		}
	}
	n, err := b.w().Write(p)
	for _, t := range b.active {
		if t.bar != nil && !t.ended {
			t.draw()
		}
		t.mu.Unlock()
	}
	return n, err
}

func (b *Bars) add(t *barTask) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active = append(b.active, t)
}

func (b *Bars) remove(t *barTask) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, a := range b.active {
		if a == t {
			b.active = append(b.active[:i], b.active[i+1:]...)
			return
		}
	}
}

// Start begins a bar.
func (b *Bars) Start(title string, unit progress.Unit, total int64) progress.Task {
	throttle := b.throttle
	if throttle == 0 {
		throttle = 100 * time.Millisecond
	}
	t := &barTask{bars: b, w: b.w(), title: title, unit: unit, total: total, throttle: throttle,
		quiet: b.Quiet, start: time.Now(), stop: make(chan struct{}), stopped: make(chan struct{})}
	if t.quiet <= 0 {
		t.open()
	}
	b.add(t)
	go t.run()
	return t
}

func (b *Bars) w() io.Writer {
	if b.W == nil {
		return io.Discard
	}
	return b.W
}

type barTask struct {
	bars     *Bars
	w        io.Writer
	title    string
	unit     progress.Unit
	total    int64
	throttle time.Duration
	quiet    time.Duration
	start    time.Time

	stop, stopped chan struct{}

	mu    sync.Mutex
	bar   *progressbar.ProgressBar // nil until drawn
	state progress.State
	drawn time.Time // the last draw
	ended bool
}

// open creates and draws the bar; t.mu is held (or t is not yet shared).
func (t *barTask) open() {
	max := t.total
	if max <= 0 {
		max = -1 // a spinner
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(t.w),
		progressbar.OptionSetDescription(t.describe()),
		progressbar.OptionSetWidth(30),
		// Draws are throttled here (draw), not by the bar, which would
		// also drop the last one, a task's end.
		progressbar.OptionThrottle(0),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetElapsedTime(true),
		// The spinner turns on each draw, which run's ticker makes
		// regular; the bar's own ticker would outlive a failed task.
		progressbar.OptionSetSpinnerChangeInterval(0),
		// Time left only where the count grows with time: bytes and
		// steps, not an operation's overall percentage.
		progressbar.OptionSetPredictTime(t.total > 0 && t.unit != progress.Percent),
	}
	switch t.unit {
	case progress.Bytes:
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowCount())
	case progress.Steps:
		if t.total > 0 {
			opts = append(opts, progressbar.OptionShowCount())
		}
	}
	t.bar = progressbar.NewOptions64(max, opts...)
	t.draw()
}

// draw shows the current state; t.mu is held and the bar open.
func (t *barTask) draw() {
	_ = t.bar.Set64(t.clamp(t.state.Current))
	t.bar.Describe(t.describe())
	t.drawn = time.Now()
}

// clamp keeps a count short of the total: an estimated total can be
// passed, and a full bar finishes, which only Done may do.
func (t *barTask) clamp(n int64) int64 {
	if t.total > 0 {
		return max(0, min(n, t.total-1))
	}
	return max(0, n)
}

// describe is the text after the bar: the title, the step and its detail.
func (t *barTask) describe() string {
	parts := []string{t.title}
	if t.state.Step != "" {
		parts = append(parts, t.state.Step)
	}
	if d := t.state.Detail; d != "" {
		if r := []rune(d); len(r) > 40 {
			d = string(r[:39]) + "…"
		}
		parts = append(parts, d)
	}
	return strings.Join(parts, ": ")
}

// run redraws every quarter second, so that the elapsed time and the
// spinner move while a step reports nothing, and opens a held-back bar
// once its quiet time is over.
func (t *barTask) run() {
	defer close(t.stopped)
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			t.mu.Lock()
			switch {
			case t.ended:
			case t.bar == nil && time.Since(t.start) >= t.quiet:
				t.open()
			case t.bar != nil:
				t.draw()
			}
			t.mu.Unlock()
		}
	}
}

func (t *barTask) Update(s progress.State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.state = s
	if t.bar != nil && time.Since(t.drawn) >= t.throttle {
		t.draw()
	}
}

func (t *barTask) Done(err error) {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	t.ended = true
	t.mu.Unlock()
	close(t.stop)
	<-t.stopped
	t.bars.remove(t)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bar == nil {
		return // ended within its quiet time: nothing was drawn
	}
	elapsed := time.Since(t.start).Round(100 * time.Millisecond)
	if err == nil {
		t.state.Step, t.state.Detail = fmt.Sprintf("done in %s", elapsed), ""
		t.bar.Describe(t.describe())
		_ = t.bar.Finish()
	} else {
		t.state.Step, t.state.Detail = fmt.Sprintf("failed after %s", elapsed), ""
		t.draw()
		_ = t.bar.Exit()
	}
	// Leave the bar's last state on its own line.
	fmt.Fprintln(t.w)
}
