package image

import (
	"fmt"
	"math"
	"strings"

	"github.com/sandboxd/sandboxd/internal/progress"
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

// state turns a build's event into the progress it reports: its overall
// percentage, its stage (a template's step by name, so that each step is a
// step of the display) and what the stage works on, counted when it counts.
func (ev Event) state() progress.State {
	st := progress.State{Step: ev.Stage, Current: int64(ev.Percent)}
	var count string
	switch {
	case ev.Total > 0:
		count = fmt.Sprintf("%d/%d", ev.Done, ev.Total)
	case ev.Done > 0:
		count = fmt.Sprint(ev.Done)
	}
	if ev.Stage == "step" && ev.Detail != "" {
		st.Step = ev.Detail
		if count != "" {
			st.Detail = "step " + count
		}
		return st
	}
	st.Detail = strings.TrimSpace(count + " " + ev.Detail)
	return st
}
