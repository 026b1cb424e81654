package image

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Event is one progress report of an image build.
type Event struct {
	// Stage is what the build is doing: "release", "resolve", "retrieve",
	// "extract", "unpack", "configure" (debootstrap's stages), "copy",
	// "step", "finalize".
	Stage string
	// Detail names the package or step being worked on, if any.
	Detail string
	// Done and Total count the stage's items; Total is 0 when unknown.
	Done, Total int
	// Percent is the progress of the whole build, 0 to 100.
	Percent float64
}

// debootstrapTracker turns debootstrap's "I:" lines into progress events.
// debootstrap does not announce how many packages it will fetch, so the
// retrieve stage's total is the number of packages an earlier build of the
// same template installed (0 if there is none); from the extract stage on,
// the number retrieved is the exact total.
//
// The stages take these shares of debootstrap's 0–100: release and resolve
// 0–5, retrieve 5–45, extract 45–55, unpack 55–75, configure 75–100.
type debootstrapTracker struct {
	expected   int
	retrieved  int
	extracted  int
	unpacked   int
	configured int
	percent    float64
}

// feed consumes one line of debootstrap output and returns the event it
// implies; ok is false for lines that say nothing about progress.
func (t *debootstrapTracker) feed(line string) (ev Event, ok bool) {
	msg, found := strings.CutPrefix(strings.TrimRight(line, " \r\n"), "I: ")
	if !found {
		return Event{}, false
	}
	verb, rest, _ := strings.Cut(msg, " ")
	rest = strings.TrimSpace(rest)
	pkg := strings.TrimSuffix(rest, "...")
	header := rest == "required packages..." || rest == "the base system..." || rest == "core packages..."
	switch {
	case verb == "Retrieving" && len(strings.Fields(rest)) == 2:
		// "Retrieving adduser 3.134": a package (release files and
		// indices have no version).
		t.retrieved++
		return t.event("retrieve", strings.Fields(rest)[0], t.retrieved, t.expected, 5, 45), true
	case verb == "Retrieving":
		return t.event("release", rest, 0, 0, 1, 1), true
	case verb == "Resolving":
		return t.event("resolve", "", 0, 0, 3, 3), true
	case verb == "Checking" && strings.HasPrefix(rest, "component"):
		return t.event("resolve", "", 0, 0, 5, 5), true
	case verb == "Extracting":
		// Only the required packages are extracted; their number is
		// not printed, so this stage may end short of its share.
		t.extracted++
		return t.event("extract", pkg, t.extracted, t.retrieved, 45, 55), true
	case verb == "Installing" && header:
		return t.event("unpack", "", 0, t.retrieved, 55, 55), true
	case verb == "Unpacking" && !header:
		t.unpacked++
		return t.event("unpack", pkg, t.unpacked, t.retrieved, 55, 75), true
	case verb == "Configuring" && !header:
		t.configured++
		return t.event("configure", pkg, t.configured, t.retrieved, 75, 100), true
	case verb == "Base" && strings.HasPrefix(rest, "system installed"):
		return t.event("configure", "", t.configured, t.retrieved, 100, 100), true
	}
	return Event{}, false
}

// event builds an Event at lo + (hi-lo)*done/total percent. Progress never
// goes backwards and stays short of hi while the stage runs, because counts
// can overshoot their total (a guessed one, or packages configured twice);
// only debootstrap's success line reaches 100.
func (t *debootstrapTracker) event(stage, detail string, done, total int, lo, hi float64) Event {
	p := lo
	if total > 0 && hi > lo {
		frac := math.Min(float64(done)/float64(total), 1)
		p = math.Min(lo+(hi-lo)*frac, hi-0.5)
	}
	t.percent = math.Max(t.percent, p)
	return Event{Stage: stage, Detail: detail, Done: done, Total: total, Percent: t.percent}
}

// reporter shows a build's progress to a person or a log.
type reporter interface {
	report(Event)
	// close ends the display; err is the build's outcome.
	close(err error)
}

// newReporter returns a progress bar drawn on w when w is a terminal, and
// structured log lines through logger otherwise.
func newReporter(w io.Writer, logger *slog.Logger, id string) reporter {
	if f, ok := w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
		return newBarReporter(w, id, 100*time.Millisecond)
	}
	return &logReporter{logger: logger, id: id, start: time.Now(), lastStage: "-"}
}

// logReporter writes a log line when the stage changes, when the build has
// advanced five percent, or every fifteen seconds, so a log shows progress
// without a line per package.
type logReporter struct {
	logger *slog.Logger
	id     string
	start  time.Time

	mu          sync.Mutex
	lastStage   string
	lastDetail  string
	lastPercent float64
	lastAt      time.Time
}

func (r *logReporter) report(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	stageChanged := ev.Stage != r.lastStage || (ev.Stage == "step" && ev.Detail != r.lastDetail)
	if !stageChanged && ev.Percent-r.lastPercent < 5 && now.Sub(r.lastAt) < 15*time.Second {
		return
	}
	r.lastStage, r.lastDetail, r.lastPercent, r.lastAt = ev.Stage, ev.Detail, ev.Percent, now
	attrs := []any{"image", r.id, "stage", ev.Stage, "percent", int(ev.Percent), "elapsed", now.Sub(r.start).Round(100 * time.Millisecond)}
	if ev.Detail != "" {
		attrs = append(attrs, "detail", ev.Detail)
	}
	if ev.Done > 0 || ev.Total > 0 {
		attrs = append(attrs, "done", ev.Done)
	}
	if ev.Total > 0 {
		attrs = append(attrs, "total", ev.Total)
	}
	r.logger.Info("building image", attrs...)
}

func (r *logReporter) close(error) {}

// barReporter draws a progress bar. A ticker refreshes it every second so
// the elapsed time moves during long steps that report nothing.
type barReporter struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu   sync.Mutex
	last Event
}

// newBarReporter draws at most once per throttle.
func newBarReporter(w io.Writer, id string, throttle time.Duration) *barReporter {
	r := &barReporter{
		w:     w,
		start: time.Now(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		bar: progressbar.NewOptions(100,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("building "+id),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetRenderBlankState(true),
			progressbar.OptionThrottle(throttle),
			progressbar.OptionSetElapsedTime(false),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionShowDescriptionAtLineEnd(),
		),
	}
	go r.tick()
	return r
}

func (r *barReporter) tick() {
	defer close(r.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.mu.Lock()
			r.bar.Describe(r.describe(r.last))
			r.mu.Unlock()
		}
	}
}

func (r *barReporter) describe(ev Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", time.Since(r.start).Round(time.Second), ev.Stage)
	switch {
	case ev.Total > 0:
		fmt.Fprintf(&b, " %d/%d", ev.Done, ev.Total)
	case ev.Done > 0:
		fmt.Fprintf(&b, " %d", ev.Done)
	}
	if ev.Detail != "" {
		d := ev.Detail
		if len(d) > 40 {
			d = d[:39] + "…"
		}
		b.WriteString(" " + d)
	}
	return b.String()
}

func (r *barReporter) report(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = ev
	// Set first: it may skip drawing (throttled), while Describe always
	// draws, and then with the new value. The bar refuses to move past
	// its maximum; Finish fills it on success.
	_ = r.bar.Set(int(math.Min(ev.Percent, 99)))
	r.bar.Describe(r.describe(ev))
}

func (r *barReporter) close(err error) {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.bar.Describe(fmt.Sprintf("%s done", time.Since(r.start).Round(time.Second)))
		_ = r.bar.Finish()
	} else {
		_ = r.bar.Exit()
	}
	// Leave the bar's last state on its own line.
	fmt.Fprintln(r.w)
}
