package sandbox

import (
	"context"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
)

// RegisterWorkers adds this package's job workers to w (before the job
// client starts).
func (m *Manager) RegisterWorkers(w *river.Workers) {
	m.runs.Register(w)
	river.AddWorker(w, &stopSandboxWorker{m: m})
}

type stopSandboxWorker struct {
	river.WorkerDefaults[jobs.StopSandboxArgs]
	m *Manager
}

// Work finishes a stop requested by another node.
func (w *stopSandboxWorker) Work(ctx context.Context, job *river.Job[jobs.StopSandboxArgs]) error {
	return w.m.finishStop(ctx, job.Args.SandboxID, job.Args.Reason)
}
