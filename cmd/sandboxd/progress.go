package main

import (
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/progress/display"
)

// tracker is how a command shows the progress of its long operations on w,
// its stderr: bars on a terminal; elsewhere log lines through log, and also
// on a terminal when the command prints JSON (asJSON) or logs JSON
// (--log-format json), whose readers are programs. Results stay on stdout.
func (g *globals) tracker(w io.Writer, log *slog.Logger, asJSON bool) progress.Tracker {
	return display.New(w, display.Options{Plain: asJSON || g.jsonLogs(), Logger: log})
}

// waitTracker is tracker for waits on the API: a create, a fork or a
// resume usually answers in well under a second and then shows nothing (a
// script's stderr stays as it was); one that takes longer (a restore of a
// large snapshot) shows a spinner, or a line, after apiWaitQuiet.
func (g *globals) waitTracker(w io.Writer, asJSON bool) progress.Tracker {
	quiet := g.waitQuiet
	if quiet <= 0 {
		quiet = apiWaitQuiet
	}
	return display.New(w, display.Options{Plain: asJSON || g.jsonLogs(), Logger: g.logger(w), Quiet: quiet})
}

// apiWaitQuiet is how long an API call runs before its wait is shown.
const apiWaitQuiet = 2 * time.Second

func (g *globals) jsonLogs() bool { return strings.EqualFold(g.logFormat, "json") }
