package image

import (
	"bufio"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/internal/progress"
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

func TestEventState(t *testing.T) {
	tests := []struct {
		ev   Event
		want progress.State
	}{
		{Event{Stage: "retrieve", Detail: "libc6", Done: 50, Total: 116, Percent: 25.7},
			progress.State{Step: "retrieve", Detail: "50/116 libc6", Current: 25}},
		{Event{Stage: "retrieve", Detail: "adduser", Done: 1, Percent: 5},
			progress.State{Step: "retrieve", Detail: "1 adduser", Current: 5}},
		{Event{Stage: "resolve", Percent: 3},
			progress.State{Step: "resolve", Current: 3}},
		// A template's step is a step of its own, by name.
		{Event{Stage: "step", Detail: "install agent CLIs", Done: 2, Total: 3, Percent: 61},
			progress.State{Step: "install agent CLIs", Detail: "step 2/3", Current: 61}},
		{Event{Stage: "finalize", Percent: 95},
			progress.State{Step: "finalize", Current: 95}},
	}
	for _, tt := range tests {
		if got := tt.ev.state(); got != tt.want {
			t.Errorf("%+v: state %+v, want %+v", tt.ev, got, tt.want)
		}
	}
}

// TestBuildReportsProgress: a build is one task of the tracker, in
// percent, fed the builder's events and ended with the build's outcome.
func TestBuildReportsProgress(t *testing.T) {
	ctx := context.Background()
	var rec progress.Recorder
	s := newTestStore(t, &fakeBuilder{}, nil)
	img, err := s.Build(ctx, "small", BuildOptions{}, &rec)
	if err != nil {
		t.Fatal(err)
	}
	tasks := rec.Snapshot()
	if len(tasks) != 1 {
		t.Fatalf("%d tasks, want 1: %+v", len(tasks), tasks)
	}
	task := tasks[0]
	if task.Title != "building image "+img.ID || task.Unit != progress.Percent || task.Total != 100 || !task.Ended || task.Err != nil {
		t.Errorf("task %+v", task)
	}
	if len(task.States) != 1 || task.States[0] != (progress.State{Step: "fake", Current: 50}) {
		t.Errorf("states %+v", task.States)
	}
	// Cached: no task at all.
	if _, err := s.Build(ctx, "small", BuildOptions{}, &rec); err != nil || len(rec.Snapshot()) != 1 {
		t.Errorf("a cached image started a task (%v)", err)
	}

	boom := errors.New("boom")
	var failed progress.Recorder
	s = newTestStore(t, &fakeBuilder{hook: func(context.Context, buildRequest) error { return boom }}, nil)
	if _, err := s.Build(ctx, "small", BuildOptions{}, &failed); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if got := failed.Snapshot(); len(got) != 1 || !errors.Is(got[0].Err, boom) {
		t.Errorf("failed build's task %+v", got)
	}
}
