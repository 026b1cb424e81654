package codeint

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Output lines of an execution, E2B's code-interpreter stream: one JSON
// object a line, ended by an end_of_execution line.
const (
	LineCount     = "number_of_executions"
	LineStdout    = "stdout"
	LineStderr    = "stderr"
	LineResult    = "result"
	LineError     = "error"
	LineKeepalive = "keepalive"
	LineEnd       = "end_of_execution"
)

// Line is one output line (the fields of all kinds; results carry theirs
// in Result).
type Line struct {
	Type           string `json:"type"`
	ExecutionCount *int   `json:"execution_count,omitempty"`
	// Text of stdout or stderr.
	Text      *string `json:"text,omitempty"`
	Timestamp string  `json:"timestamp,omitempty"`
	// Name, Value and Traceback of an error.
	Name      *string `json:"name,omitempty"`
	Value     *string `json:"value,omitempty"`
	Traceback *string `json:"traceback,omitempty"`
}

// Result is a result line: each representation the kernel gave, by E2B's
// field names; Extra holds the ones E2B has no field for, by MIME type.
type Result struct {
	Type         string                     `json:"type"`
	Text         *string                    `json:"text,omitempty"`
	HTML         json.RawMessage            `json:"html,omitempty"`
	Markdown     json.RawMessage            `json:"markdown,omitempty"`
	SVG          json.RawMessage            `json:"svg,omitempty"`
	PNG          json.RawMessage            `json:"png,omitempty"`
	JPEG         json.RawMessage            `json:"jpeg,omitempty"`
	PDF          json.RawMessage            `json:"pdf,omitempty"`
	LaTeX        json.RawMessage            `json:"latex,omitempty"`
	JSON         json.RawMessage            `json:"json,omitempty"`
	JavaScript   json.RawMessage            `json:"javascript,omitempty"`
	Data         json.RawMessage            `json:"data,omitempty"`
	Chart        json.RawMessage            `json:"chart,omitempty"`
	Extra        map[string]json.RawMessage `json:"extra"`
	IsMainResult bool                       `json:"is_main_result"`
}

// resultFields maps a MIME type to its field of Result.
func (r *Result) field(mime string) *json.RawMessage {
	switch mime {
	case "text/html":
		return &r.HTML
	case "text/markdown":
		return &r.Markdown
	case "image/svg+xml":
		return &r.SVG
	case "image/png":
		return &r.PNG
	case "image/jpeg":
		return &r.JPEG
	case "application/pdf":
		return &r.PDF
	case "text/latex":
		return &r.LaTeX
	case "application/json":
		return &r.JSON
	case "application/javascript":
		return &r.JavaScript
	case "e2b/data":
		return &r.Data
	case "e2b/chart":
		return &r.Chart
	}
	return nil
}

// resultOf is the result line of a kernel's MIME bundle. Plain text loses
// one pair of surrounding quotes, as E2B's does (a string's repr reads as
// the string).
func resultOf(data map[string]json.RawMessage, main bool) Result {
	r := Result{Type: LineResult, Extra: map[string]json.RawMessage{}, IsMainResult: main}
	for mime, v := range data {
		if mime == "text/plain" {
			var s string
			if json.Unmarshal(v, &s) == nil {
				if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
					s = s[1 : len(s)-1]
				}
				r.Text = &s
			}
			continue
		}
		if f := r.field(mime); f != nil {
			*f = v
			continue
		}
		r.Extra[mime] = v
	}
	return r
}

// keepaliveEvery is how long an execution's stream may be silent before a
// keepalive line goes (E2B's 5 s): a caller that has gone is then noticed.
const keepaliveEvery = 5 * time.Second

// interruptGrace is how long an interrupted cell has to end before its
// kernel is restarted, so that the context is usable again.
const interruptGrace = 10 * time.Second

// execution is one run of code in a context.
type execution struct {
	cx      *Context
	code    string
	env     map[string]string
	timeout time.Duration
	// write sends one line to the caller; an error means the caller is
	// gone.
	write func(v any) error
}

// run runs x and writes its lines, the last one end_of_execution (unless
// the caller went away). It interrupts the kernel when ctx ends or the
// timeout runs out, and restarts it when the interrupt does not end the
// cell within interruptGrace.
func (x execution) run(ctx context.Context) {
	select {
	case x.cx.turn <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-x.cx.turn }()
	code := x.code
	ch, err := x.cx.sh.call(request{Op: "execute", Ctx: x.cx.ID, Code: &code, Env: x.env}, true)
	if err != nil {
		x.writeError("UnexpectedEndOfExecution", err.Error())
		_ = x.write(Line{Type: LineEnd})
		return
	}
	var (
		gone      = ctx.Done()
		keep      = time.NewTicker(keepaliveEvery)
		wrote     = time.Now()
		timer     <-chan time.Time
		grace     <-chan time.Time
		quiet     bool // the caller is gone: drain, write nothing
		timedOut  bool
		restarted bool
	)
	defer keep.Stop()
	if x.timeout > 0 {
		t := time.NewTimer(x.timeout)
		defer t.Stop()
		timer = t.C
	}
	interrupt := func() {
		_, _ = x.cx.sh.call(request{Op: "interrupt", Ctx: x.cx.ID}, false)
		grace = time.After(interruptGrace)
	}
	send := func(v any) {
		if quiet {
			return
		}
		if err := x.write(v); err != nil {
			quiet = true
			if grace == nil {
				interrupt()
			}
			return
		}
		wrote = time.Now()
	}
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				send(errorLine("UnexpectedEndOfExecution", "Connection to the execution was closed before the execution was finished: "+orUnknown("", x.cx.sh.err), ""))
				send(Line{Type: LineEnd})
				return
			}
			switch e.Ev {
			case "count":
				n := e.N
				send(Line{Type: LineCount, ExecutionCount: &n})
			case "stream":
				text, kind := e.Text, LineStdout
				if e.Name == "stderr" {
					kind = LineStderr
				}
				send(Line{Type: kind, Text: &text, Timestamp: isoTime(e.Time)})
			case "result":
				send(resultOf(e.Data, e.Main))
			case "error":
				// After a timeout, the timeout is the error: the
				// interrupt's KeyboardInterrupt is its effect. A restart
				// that had to follow is said, as it loses the state the
				// timeout's error said was kept (the last error counts).
				lost := restarted && e.Ename == "ContextRestarting"
				if timedOut && !lost {
					continue
				}
				if lost {
					e.Ename, e.Evalue = "ExecutionInterrupted", "the cell did not stop when interrupted, so its context was restarted; its state is lost"
				}
				send(errorLine(e.Ename, e.Evalue, strings.Join(e.Traceback, "\n")))
			case "done", "died":
				send(Line{Type: LineEnd})
				return
			}
		case <-keep.C:
			if time.Since(wrote) >= keepaliveEvery {
				send(Line{Type: LineKeepalive})
			}
		case <-gone:
			gone, quiet = nil, true
			if grace == nil {
				interrupt()
			}
		case <-timer:
			timer, timedOut = nil, true
			send(errorLine("TimeoutError", fmt.Sprintf("Execution timed out after %s: the cell was interrupted; the context keeps its state", x.timeout), ""))
			if grace == nil {
				interrupt()
			}
		case <-grace:
			// The cell ignores SIGINT: only a new kernel frees the
			// context. Its answer is the restart's; the cell ends with it.
			grace, restarted = nil, true
			if rch, err := x.cx.sh.call(request{Op: "restart", Ctx: x.cx.ID}, true); err == nil {
				go func() {
					for range rch {
					}
				}()
			}
		}
	}
}

func (x execution) writeError(name, value string) {
	_ = x.write(errorLine(name, value, ""))
}

func errorLine(name, value, traceback string) Line {
	return Line{Type: LineError, Name: &name, Value: &value, Traceback: &traceback}
}

// isoTime turns the kernel's message date (Python's str of a datetime) into
// ISO 8601, which the Python SDK parses.
func isoTime(t string) string {
	if t == "" {
		return time.Now().UTC().Format(time.RFC3339Nano)
	}
	return strings.Replace(t, " ", "T", 1)
}
