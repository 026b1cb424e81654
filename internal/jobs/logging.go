package jobs

import (
	"context"
	"log/slog"
	"strings"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// riverLogger is the logger River is given. River logs its periodic
// status at Info (each queue's job counts every few seconds, each
// maintenance pass) along with its start, stop and migrations: at the
// service's default level that chatter drowns the lines an operator reads.
// Its Info lines go to Debug, except those saying a job failed; its
// warnings and errors keep their level.
func riverLogger(log *slog.Logger) *slog.Logger {
	return slog.New(riverHandler{log.Handler()})
}

type riverHandler struct{ slog.Handler }

// Enabled is the wrapped handler's: a record is only ever lowered, so one
// it would drop stays dropped.
func (h riverHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, l)
}

func (h riverHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && !jobFailed(r.Message) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h riverHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return riverHandler{h.Handler.WithAttrs(attrs)}
}

func (h riverHandler) WithGroup(name string) slog.Handler {
	return riverHandler{h.Handler.WithGroup(name)}
}

// jobFailed reports whether River's message is about a job that returned
// an error or panicked ("JobExecutor: Job errored; retrying").
func jobFailed(msg string) bool {
	return strings.Contains(msg, ": Job errored") || strings.Contains(msg, ": Job panicked")
}

// panicLogger logs the stack of a job's panic at Debug, as one attribute:
// River logs the panic itself as an error, without the stack, and keeps
// the stack with the job's errors (riverui shows it); a multi-line stack in
// an error line would break every line-based log reader.
type panicLogger struct{ log *slog.Logger }

// HandleError implements river.ErrorHandler: River's default.
func (panicLogger) HandleError(context.Context, *rivertype.JobRow, error) *river.ErrorHandlerResult {
	return nil
}

// HandlePanic implements river.ErrorHandler: the job follows River's retry
// policy, as by default.
func (p panicLogger) HandlePanic(ctx context.Context, job *rivertype.JobRow, panicVal any, trace string) *river.ErrorHandlerResult {
	p.log.DebugContext(ctx, "job panic stack", "job_id", job.ID, "kind", job.Kind, "attempt", job.Attempt, "stack", trace)
	return nil
}
