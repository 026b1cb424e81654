package main

import (
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/progress/display"
)

// progress is how a command shows the progress of its long operations on
// w, its stderr, and the logger for the rest it writes there: bars on a
// terminal, with a logger whose lines keep off them; elsewhere log lines,
// and also on a terminal when the command prints JSON (asJSON) or logs
// JSON (--log-format json), whose readers are programs. Results stay on
// stdout.
func (g *globals) progress(w io.Writer, asJSON bool) (progress.Tracker, *slog.Logger) {
	return display.New(w, display.Options{Plain: asJSON || g.jsonLogs(), NewLogger: g.logger})
}

// tracker is progress for serve, whose logger exists before: its lines
// are the server's log, with its attributes.
func (g *globals) tracker(w io.Writer, log *slog.Logger) progress.Tracker {
	t, _ := display.New(w, display.Options{Plain: g.jsonLogs(), NewLogger: func(io.Writer) *slog.Logger { return log }})
	return t
}

// waitTracker is progress for waits on the API: a create, a fork or a
// resume usually answers in well under a second and then shows nothing (a
// script's stderr stays as it was); one that takes longer (a restore of a
// large snapshot) shows a spinner, or a line, after apiWaitQuiet.
func (g *globals) waitTracker(w io.Writer, asJSON bool) progress.Tracker {
	quiet := g.waitQuiet
	if quiet <= 0 {
		quiet = apiWaitQuiet
	}
	t, _ := display.New(w, display.Options{Plain: asJSON || g.jsonLogs(), NewLogger: g.logger, Quiet: quiet})
	return t
}

// apiWaitQuiet is how long an API call runs before its wait is shown.
const apiWaitQuiet = 2 * time.Second

func (g *globals) jsonLogs() bool { return strings.EqualFold(g.logFormat, "json") }
