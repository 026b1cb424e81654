package kernel

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// reporter shows a build's progress: a bar on w when w is set, else a log
// line every 30 seconds. Compilation dominates, so the bar counts kbuild's
// steps (CC, LD, AR, ... lines) against the last build's count.
type reporter struct {
	log   *slog.Logger
	bar   *progressbar.ProgressBar
	w     io.Writer
	total int
	start time.Time

	mu       sync.Mutex
	stageMsg string
	lastLog  time.Time
}

func newReporter(w io.Writer, logger *slog.Logger, id string, total int) *reporter {
	r := &reporter{log: logger, w: w, total: total, start: time.Now()}
	if w != nil {
		r.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("kernel "+id),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetRenderBlankState(true),
			progressbar.OptionThrottle(250*time.Millisecond),
			progressbar.OptionShowCount(),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionShowDescriptionAtLineEnd(),
		)
	}
	return r
}

// stage starts a phase (extracting, configuring, compiling).
func (r *reporter) stage(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stageMsg = msg
	if r.bar != nil {
		r.bar.Describe(fmt.Sprintf("%s %s", time.Since(r.start).Round(time.Second), msg))
		return
	}
	r.log.Info("building guest kernel", "stage", msg)
}

// step records the n-th build step, which produced target.
func (r *reporter) step(n int, target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bar != nil {
		// The count may pass the estimate; keep the bar short of full
		// until the build really ends.
		_ = r.bar.Set(min(n, r.total-1))
		r.bar.Describe(fmt.Sprintf("%s %s %s", time.Since(r.start).Round(time.Second), r.stageMsg, target))
		return
	}
	if time.Since(r.lastLog) >= 30*time.Second {
		r.lastLog = time.Now()
		r.log.Info("building guest kernel", "stage", r.stageMsg, "step", n, "of_about", r.total, "elapsed", time.Since(r.start).Round(time.Second))
	}
}

func (r *reporter) close(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bar == nil {
		return
	}
	if err == nil {
		r.bar.Describe(fmt.Sprintf("%s done", time.Since(r.start).Round(time.Second)))
		_ = r.bar.Finish()
	} else {
		_ = r.bar.Exit()
	}
	fmt.Fprintln(r.w)
}
