package image

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

func readLines(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestDebootstrapTrackerCapture feeds a whole captured run of
// `debootstrap --variant=minbase --include=ca-certificates,git,curl bookworm`.
func TestDebootstrapTrackerCapture(t *testing.T) {
	lines := readLines(t, "testdata/debootstrap-minbase.log")
	for _, expected := range []int{0, 116, 40} {
		tr := &debootstrapTracker{expected: expected}
		var events []Event
		for _, l := range lines {
			if ev, ok := tr.feed(l); ok {
				events = append(events, ev)
			}
		}
		if tr.retrieved != 116 {
			t.Errorf("expected=%d: retrieved %d packages, want 116", expected, tr.retrieved)
		}
		last := 0.0
		stages := map[string]bool{}
		for i, ev := range events {
			if ev.Percent < last {
				t.Fatalf("expected=%d: event %d (%+v) went back from %.1f%%", expected, i, ev, last)
			}
			if ev.Percent > 100 {
				t.Fatalf("expected=%d: event %d over 100%%: %+v", expected, i, ev)
			}
			if ev.Percent == 100 && i != len(events)-1 {
				t.Fatalf("expected=%d: reached 100%% before the end at event %d: %+v", expected, i, ev)
			}
			last = ev.Percent
			stages[ev.Stage] = true
		}
		if last != 100 {
			t.Errorf("expected=%d: ended at %.1f%%, want 100", expected, last)
		}
		for _, s := range []string{"release", "resolve", "retrieve", "extract", "unpack", "configure"} {
			if !stages[s] {
				t.Errorf("expected=%d: no %s stage", expected, s)
			}
		}
	}
}

func TestDebootstrapTrackerLines(t *testing.T) {
	tests := []struct {
		name  string
		state debootstrapTracker
		line  string
		ok    bool
		want  Event
	}{
		{"release file", debootstrapTracker{}, "I: Retrieving InRelease ", true,
			Event{Stage: "release", Detail: "InRelease", Percent: 1}},
		{"package index", debootstrapTracker{}, "I: Retrieving Packages ", true,
			Event{Stage: "release", Detail: "Packages", Percent: 1}},
		{"resolving", debootstrapTracker{}, "I: Resolving dependencies of base packages...", true,
			Event{Stage: "resolve", Percent: 3}},
		{"package without a guess", debootstrapTracker{}, "I: Retrieving adduser 3.134", true,
			Event{Stage: "retrieve", Detail: "adduser", Done: 1, Percent: 5}},
		{"package with a guess", debootstrapTracker{expected: 100, retrieved: 49}, "I: Retrieving libc6 2.36-9+deb12u10", true,
			Event{Stage: "retrieve", Detail: "libc6", Done: 50, Total: 100, Percent: 25}},
		{"more packages than guessed stay short of the stage end", debootstrapTracker{expected: 10, retrieved: 20}, "I: Retrieving zlib1g 1:1.2.13", true,
			Event{Stage: "retrieve", Detail: "zlib1g", Done: 21, Total: 10, Percent: 44.5}},
		{"validating says nothing", debootstrapTracker{}, "I: Validating adduser 3.134", false, Event{}},
		{"extracting", debootstrapTracker{retrieved: 100, extracted: 49}, "I: Extracting libc6...", true,
			Event{Stage: "extract", Detail: "libc6", Done: 50, Total: 100, Percent: 50}},
		{"installing core", debootstrapTracker{retrieved: 100}, "I: Installing core packages...", true,
			Event{Stage: "unpack", Total: 100, Percent: 55}},
		{"unpack header", debootstrapTracker{retrieved: 100}, "I: Unpacking required packages...", false, Event{}},
		{"unpacking", debootstrapTracker{retrieved: 100, unpacked: 49}, "I: Unpacking libc6:amd64...", true,
			Event{Stage: "unpack", Detail: "libc6:amd64", Done: 50, Total: 100, Percent: 65}},
		{"configure header", debootstrapTracker{retrieved: 100}, "I: Configuring the base system...", false, Event{}},
		{"configuring", debootstrapTracker{retrieved: 100, configured: 49}, "I: Configuring ca-certificates...", true,
			Event{Stage: "configure", Detail: "ca-certificates", Done: 50, Total: 100, Percent: 87.5}},
		{"configured more than retrieved", debootstrapTracker{retrieved: 100, configured: 120}, "I: Configuring libc-bin...", true,
			Event{Stage: "configure", Detail: "libc-bin", Done: 121, Total: 100, Percent: 99.5}},
		{"success", debootstrapTracker{retrieved: 100, configured: 103}, "I: Base system installed successfully.", true,
			Event{Stage: "configure", Done: 103, Total: 100, Percent: 100}},
		{"never backwards", debootstrapTracker{percent: 60}, "I: Resolving dependencies of required packages...", true,
			Event{Stage: "resolve", Percent: 60}},
		{"warnings are not progress", debootstrapTracker{}, "W: Failure while configuring base packages.", false, Event{}},
		{"other output", debootstrapTracker{}, "dpkg: warning: something", false, Event{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := tt.state
			got, ok := tr.feed(tt.line)
			if ok != tt.ok || got != tt.want {
				t.Errorf("feed(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestAptTrackerCapture feeds captured `apt-get install -o APT::Status-Fd=1`
// output of jq and less.
func TestAptTrackerCapture(t *testing.T) {
	var tr aptTracker
	var events []Event
	for _, l := range readLines(t, "testdata/apt-install.log") {
		if ev, ok := tr.feed(l); ok {
			events = append(events, ev)
		}
	}
	if len(events) == 0 {
		t.Fatal("no events")
	}
	last := 0.0
	seen := map[string]bool{}
	for i, ev := range events {
		if ev.Percent < last {
			t.Fatalf("event %d (%+v) went back from %.1f", i, ev, last)
		}
		last = ev.Percent
		seen[ev.Stage+" "+ev.Detail] = true
	}
	if last < 95 || last > 100 {
		t.Errorf("ended at %.1f%%, want 95–100", last)
	}
	for _, want := range []string{"download ", "install ", "unpack jq", "configure jq", "configure libonig5"} {
		if !seen[want] {
			t.Errorf("no event %q in %v", want, seen)
		}
	}
}

func TestAptTrackerLines(t *testing.T) {
	tests := []struct {
		line string
		ok   bool
		want Event
	}{
		{"dlstatus:2:25.0:Retrieving file 2 of 4", true, Event{Stage: "download", Done: 2, Total: 4, Percent: 10}},
		{"pmstatus:dpkg-exec:0.0000:Running dpkg", true, Event{Stage: "install", Percent: 40}},
		{"pmstatus:less:5.8824:Unpacking less (amd64)", true, Event{Stage: "unpack", Detail: "less", Percent: 40 + 60*5.8824/100}},
		{"pmstatus:less:50:Preparing to configure less (amd64)", true, Event{Stage: "configure", Detail: "less", Percent: 70}},
		{"pmstatus:libc6:amd64:50:Configuring libc6 (amd64)", true, Event{Stage: "configure", Detail: "libc6", Percent: 70}},
		{"Get:1 http://mirror.example/debian bookworm/main amd64 less amd64 590-2.1~deb12u2 [132 kB]", false, Event{}},
		{"pmstatus:broken", false, Event{}},
		{"dlstatus:1:notanumber:Retrieving file 1 of 4", false, Event{}},
	}
	for _, tt := range tests {
		var tr aptTracker
		got, ok := tr.feed(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("feed(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

// recordHandler keeps the records logged through it.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func TestLogReporter(t *testing.T) {
	h := &recordHandler{}
	// A bytes.Buffer is not a terminal, so the reporter logs.
	r := newReporter(&bytes.Buffer{}, slog.New(h), "minimal-0123456789ab")
	if _, ok := r.(*logReporter); !ok {
		t.Fatalf("reporter for a buffer is %T, want *logReporter", r)
	}
	events := []Event{
		{Stage: "retrieve", Detail: "a", Done: 1, Percent: 5},
		{Stage: "retrieve", Detail: "b", Done: 2, Percent: 6},  // same stage, +1%: dropped
		{Stage: "retrieve", Detail: "c", Done: 3, Percent: 11}, // +6%: logged
		{Stage: "unpack", Detail: "d", Done: 1, Total: 9, Percent: 11.5},
		{Stage: "step", Detail: "install npm", Percent: 60},
		{Stage: "step", Detail: "install agent CLIs", Percent: 61}, // new step: logged
	}
	for _, ev := range events {
		r.report(ev)
	}
	r.close(nil)
	var got []string
	for _, rec := range h.records {
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		for _, k := range []string{"image", "stage", "percent", "elapsed"} {
			if _, ok := attrs[k]; !ok {
				t.Errorf("record %q lacks %s: %v", rec.Message, k, attrs)
			}
		}
		got = append(got, attrs["stage"]+":"+attrs["detail"]+":"+attrs["percent"])
	}
	want := "retrieve:a:5 retrieve:c:11 unpack:d:11 step:install npm:60 step:install agent CLIs:61"
	if strings.Join(got, " ") != want {
		t.Errorf("logged %q, want %q", strings.Join(got, " "), want)
	}
}

func TestBarReporterDraws(t *testing.T) {
	var buf bytes.Buffer
	r := newBarReporter(&buf, "minimal-0123456789ab", 0)
	r.report(Event{Stage: "unpack", Detail: "libc6", Done: 10, Total: 90, Percent: 42})
	r.close(nil)
	out := buf.String()
	for _, want := range []string{"unpack 10/90 libc6", "100%", "done"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
}
