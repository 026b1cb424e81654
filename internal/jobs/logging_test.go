package jobs_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

type panicArgs struct{}

func (panicArgs) Kind() string { return "test-panic" }

type panicWorker struct {
	river.WorkerDefaults[panicArgs]
}

func (panicWorker) Work(context.Context, *river.Job[panicArgs]) error {
	panic("the worker broke")
}

// syncBuffer is a log destination written from River's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRiverLogging: River's status and lifecycle lines are at debug, its
// line about a failed job stays at info and its errors at error; a job's
// panic is an error line without a stack, and the stack is one debug
// line's attribute.
func TestRiverLogging(t *testing.T) {
	ctx := t.Context()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	workers := river.NewWorkers()
	river.AddWorker(workers, panicWorker{})
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "n1", Workers: workers, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := jc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := jc.Insert(ctx, panicArgs{}, ""); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "job panic stack"); {
		if time.Now().After(deadline) {
			t.Fatalf("the job did not panic; log:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := jc.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	has := func(level, msg string) bool {
		for _, l := range lines {
			if strings.Contains(l, "level="+level+" ") && strings.Contains(l, msg) {
				return true
			}
		}
		return false
	}
	for _, want := range []struct{ level, msg string }{
		{"DEBUG", `msg="River client started"`},
		{"DEBUG", "Applied migration"},
		{"ERROR", "panic recovery"},
		{"INFO", "Job panicked"},
		{"DEBUG", `msg="job panic stack"`},
	} {
		if !has(want.level, want.msg) {
			t.Errorf("no %s line with %s", want.level, want.msg)
		}
	}
	if has("INFO", "River client started") || has("INFO", "Applied migration") {
		t.Error("River's lifecycle lines are still at info")
	}
	for _, l := range lines {
		stack := strings.Contains(l, "panicWorker") || strings.Contains(l, ".go:")
		if stack && !strings.Contains(l, "level=DEBUG") {
			t.Errorf("a stack above debug: %s", l)
		}
		if strings.Contains(l, `msg="job panic stack"`) && !strings.Contains(l, "panicWorker") {
			t.Errorf("the stack line has no stack: %s", l)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", out.String())
	}
}
