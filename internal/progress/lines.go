package progress

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
)

// Lines is the Tracker for logs, pipes and CI: each task writes log
// records, one line each and never a carriage return, and few of them: when
// it starts, when its step changes, when it has advanced a twentieth of its
// total, and otherwise every Interval while it runs (a ticker writes those
// too, so a long step that reports nothing still shows it is alive). A
// successful task that wrote anything ends with a record of its step
// "done"; a failed one writes nothing more, as its caller reports the
// error.
type Lines struct {
	// Logger receives the records; the task's title is the message.
	Logger *slog.Logger
	// Interval is the longest silence of a running task (default 15 s).
	Interval time.Duration
	// Quiet, when set, holds a task's first record back this long: a task
	// that ends sooner writes nothing. For waits that are usually short
	// (an API call), so that a script's stderr stays clean.
	Quiet time.Duration

	// now is the clock, replaced in tests.
	now func() time.Time
	// tick is the ticker's period; 0 means a second.
	tick time.Duration
}

// Start begins a task that writes through l.Logger.
func (l *Lines) Start(title string, unit Unit, total int64) Task {
	now := l.now
	if now == nil {
		now = time.Now
	}
	interval := l.Interval
	if interval <= 0 {
		interval = 15 * time.Second
	}
	logger := l.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &lineTask{
		logger: logger, title: title, unit: unit, total: total,
		interval: interval, quiet: l.Quiet, now: now, start: now(),
		stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	if t.quiet <= 0 {
		t.write(t.start)
	}
	period := l.tick
	if period <= 0 {
		// A second, or less for a short Quiet, which the ticker ends.
		period = time.Second
		if q := l.Quiet / 2; q > 0 && q < period {
			period = q
		}
	}
	go t.run(period)
	return t
}

type lineTask struct {
	logger   *slog.Logger
	title    string
	unit     Unit
	total    int64
	interval time.Duration
	quiet    time.Duration
	now      func() time.Time
	start    time.Time

	stop, stopped chan struct{}

	mu       sync.Mutex
	state    State
	written  bool      // a record was written
	lastAt   time.Time // when
	lastStep string    // of which step
	lastCur  int64     // at which count
	ended    bool
}

func (t *lineTask) run(period time.Duration) {
	defer close(t.stopped)
	tk := time.NewTicker(period)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			t.tick()
		}
	}
}

// tick writes a record when the task has been silent too long.
func (t *lineTask) tick() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	now := t.now()
	switch {
	case !t.written && now.Sub(t.start) >= t.quiet:
		t.write(now)
	case t.written && now.Sub(t.lastAt) >= t.interval:
		t.write(now)
	}
}

func (t *lineTask) Update(s State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.state = s
	now := t.now()
	if !t.written {
		if now.Sub(t.start) >= t.quiet {
			t.write(now)
		}
		return
	}
	moved := t.total > 0 && (s.Current-t.lastCur)*20 >= t.total
	if s.Step != t.lastStep || moved || now.Sub(t.lastAt) >= t.interval {
		t.write(now)
	}
}

func (t *lineTask) Done(err error) {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	t.ended = true
	if err == nil && t.written {
		t.state.Step, t.state.Detail = "done", ""
		if t.total > 0 && t.state.Current < t.total {
			t.state.Current = t.total
		}
		t.write(t.now())
	}
	t.mu.Unlock()
	close(t.stop)
	<-t.stopped
}

// write logs the current state; t.mu is held (or t is not yet shared).
func (t *lineTask) write(now time.Time) {
	s := t.state
	elapsed := now.Sub(t.start)
	attrs := make([]slog.Attr, 0, 8)
	if s.Step != "" {
		attrs = append(attrs, slog.String("step", s.Step))
	}
	if s.Detail != "" {
		attrs = append(attrs, slog.String("detail", s.Detail))
	}
	switch t.unit {
	case Percent:
		attrs = append(attrs, slog.Int64("percent", min(s.Current, 100)))
	case Bytes:
		attrs = append(attrs, slog.String("done", humanize.IBytes(uint64(max(s.Current, 0)))))
		if t.total > 0 {
			attrs = append(attrs, slog.String("total", humanize.IBytes(uint64(t.total))))
		}
		if secs := elapsed.Seconds(); secs >= 1 && s.Current > 0 {
			attrs = append(attrs, slog.String("rate", humanize.IBytes(uint64(float64(s.Current)/secs))+"/s"))
		}
	default:
		if t.total > 0 || s.Current > 0 {
			attrs = append(attrs, slog.Int64("done", s.Current))
		}
		if t.total > 0 {
			attrs = append(attrs, slog.Int64("total", t.total))
		}
	}
	if t.unit != Percent && t.total > 0 {
		attrs = append(attrs, slog.Int64("percent", min(100, 100*max(s.Current, 0)/t.total)))
		if eta, ok := estimate(elapsed, s.Current, t.total); ok && s.Step != "done" {
			attrs = append(attrs, slog.Duration("eta", eta))
		}
	}
	attrs = append(attrs, slog.Duration("elapsed", elapsed.Round(100*time.Millisecond)))
	t.logger.LogAttrs(context.Background(), slog.LevelInfo, t.title, attrs...)
	t.written, t.lastAt, t.lastStep, t.lastCur = true, now, s.Step, s.Current
}

// estimate is the time left at the average rate so far, rounded to a
// second; ok is false until there is a rate worth extrapolating (a second
// and some progress) and once the count reached the total.
func estimate(elapsed time.Duration, current, total int64) (time.Duration, bool) {
	if elapsed < time.Second || current <= 0 || current >= total {
		return 0, false
	}
	left := time.Duration(float64(elapsed) * float64(total-current) / float64(current))
	return left.Round(time.Second), true
}
