// Package progress is how sandboxd's long operations (image and kernel
// builds, uploads, waits on the API, benchmarks) say how far they are,
// without knowing who watches. An operation asks a Tracker for a Task and
// reports States to it; the Tracker decides what a person sees. This
// package has the interface, the log-line Tracker for logs, pipes and CI
// (Lines) and one that shows nothing (Discard); progress/display has the
// terminal's bars and the choice between the two, so that the packages that
// report (internal/image, internal/kernel, bench) never depend on a terminal
// library.
package progress

import "sync"

// Unit is what a task counts.
type Unit int

const (
	// Steps are items: packages, build steps, sandboxes, phases.
	Steps Unit = iota
	// Bytes are shown as sizes, with a transfer rate.
	Bytes
	// Percent counts 0 to 100 of the whole operation, for operations whose
	// phases have no common unit (an image build); it gets no ETA, as
	// such a percentage does not grow evenly with time.
	Percent
)

// State is where a task is.
type State struct {
	// Step is the phase: "retrieve", "compiling", "uploading".
	Step string
	// Detail is what the phase works on: a package, a file. It may be
	// empty.
	Detail string
	// Current counts the units done, of the task's total. It may pass
	// an estimated total; displays stop short of full until Done.
	Current int64
}

// Task is one long operation's progress. Its methods are safe for
// concurrent use.
type Task interface {
	// Update reports the operation's state.
	Update(State)
	// Done ends the task; err is the operation's outcome. A task is done
	// once; later calls are ignored.
	Done(err error)
}

// Tracker starts tasks.
type Tracker interface {
	// Start begins a task named title ("building image minimal-0123…"),
	// counting unit, with total units in all: 0 when the total is unknown
	// (the display then shows a spinner and the step, with no ETA).
	Start(title string, unit Unit, total int64) Task
}

// Discard is a Tracker whose tasks show nothing.
type Discard struct{}

// Start returns a task that ignores what it is told.
func (Discard) Start(string, Unit, int64) Task { return discardTask{} }

type discardTask struct{}

func (discardTask) Update(State) {}
func (discardTask) Done(error)   {}

// Or returns t, or Discard when t is nil, so that an operation given no
// Tracker can report all the same.
func Or(t Tracker) Tracker {
	if t == nil {
		return Discard{}
	}
	return t
}

// Func adapts a function to a Tracker.
type Func func(title string, unit Unit, total int64) Task

// Start calls f.
func (f Func) Start(title string, unit Unit, total int64) Task { return f(title, unit, total) }

// Recorder is a Tracker that keeps every task and state it is given, for
// tests of the operations that report.
type Recorder struct {
	mu    sync.Mutex
	Tasks []*RecordedTask
}

// RecordedTask is one task a Recorder started.
type RecordedTask struct {
	Title  string
	Unit   Unit
	Total  int64
	States []State
	Ended  bool
	Err    error

	mu *sync.Mutex
}

// Start records a task.
func (r *Recorder) Start(title string, unit Unit, total int64) Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &RecordedTask{Title: title, Unit: unit, Total: total, mu: &r.mu}
	r.Tasks = append(r.Tasks, t)
	return t
}

// Snapshot returns a copy of the tasks recorded so far.
func (r *Recorder) Snapshot() []RecordedTask {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RecordedTask, len(r.Tasks))
	for i, t := range r.Tasks {
		out[i] = *t
		out[i].States = append([]State(nil), t.States...)
	}
	return out
}

// Update records s.
func (t *RecordedTask) Update(s State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.Ended {
		t.States = append(t.States, s)
	}
}

// Done records the end.
func (t *RecordedTask) Done(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.Ended {
		t.Ended, t.Err = true, err
	}
}
