package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/api"
)

// logsCommand is `sandboxd sandbox logs RUN`: a run's log followed to the
// run's end, and the run's outcome as the exit status.
func logsCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "logs RUN_ID",
		Short: "Follow a run's log until the run ends; the exit status is its command's",
		Long: "Follow the log of a run (the runId of a create with a command or prompt) from its start until the run\n" +
			"ends: its command's stdout here on stdout, its stderr and sandboxd's notes on stderr. The exit status\n" +
			"is the command's; a run that failed (its command not found, its sandbox's timeout) exits non-zero with\n" +
			"the reason. A run whose log the server no longer keeps shows the output its record keeps. --json\n" +
			"prints the run's record once it ended instead of the log.",
		Example: "  sandboxd sandbox logs run_123\n" +
			"  sandboxd sandbox logs --json run_123 | jq .output.exitCode",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.waitForRun(cmd.Context(), args[0], f, stdio{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}, nil)
		},
	}
}

// waitForRun follows run id's log to its end (without --json) and ends
// with the run's outcome: nil for a command that exited 0, else an
// exitError, said on stderr. With --json it prints the run's record, or
// the object wrap makes of it.
func (c *apiClient) waitForRun(ctx context.Context, id string, f *clientFlags, std stdio, wrap func(run json.RawMessage) any) error {
	logged := false
	var err error
	if f.asJSON {
		_, err = c.followRunLog(ctx, id, f.account, io.Discard, io.Discard)
	} else {
		logged, err = c.followRunLog(ctx, id, f.account, std.out, std.err)
	}
	if err != nil {
		return err
	}
	raw, run, err := c.runRecord(ctx, id, f.account)
	if err != nil {
		return err
	}
	switch {
	case f.asJSON:
		var v any = raw
		if wrap != nil {
			v = wrap(raw)
		}
		if err := printJSON(std.out, v); err != nil {
			return err
		}
	case !logged:
		run.showKept(std)
	}
	return run.outcome(std.err, f.asJSON)
}

// followRunLog copies run id's log (GET /api/tasks/runs/{id}/log) to
// stdout and stderr until its end event, and says whether any log came.
func (c *apiClient) followRunLog(ctx context.Context, id, account string, stdout, stderr io.Writer) (bool, error) {
	cl, err := c.api()
	if err != nil {
		return false, err
	}
	resp, err := cl.GetTasksRunsIDLog(ctx, id, &client.GetTasksRunsIDLogParams{AccountID: optional(account)})
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, errorAnswer(resp)
	}
	lines := &logLines{stdout: stdout, stderr: stderr}
	ended := false
	err = readEvents(resp.Body, func(event string, data []byte) (bool, error) {
		var d struct {
			api.ExecOutput
			api.ExecFailure
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return false, fmt.Errorf("decode event: %w", err)
		}
		switch event {
		case "log":
			lines.write(d.Data)
		case "end":
			ended = true
			return true, nil
		case "error":
			return true, fmt.Errorf("run log: %s", d.Error)
		}
		return false, nil
	})
	lines.flush()
	if err == nil && !ended {
		err = errors.New("the run's log stream ended before the run did")
	}
	return lines.any, err
}

// logLines routes a run's log, line by line, by the stream each line is
// tagged with: "[stdout] " to stdout, "[stderr] " to stderr without their
// tags; sandboxd's own lines ("[sandboxd] ...") to stderr as they are.
type logLines struct {
	stdout, stderr io.Writer
	partial        string // the start of a line the next event ends
	any            bool   // some log came
}

func (l *logLines) write(s string) {
	l.any = l.any || s != ""
	s = l.partial + s
	for {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			l.partial = s
			return
		}
		l.line(s[:i+1])
		s = s[i+1:]
	}
}

// flush writes a last line that had no newline.
func (l *logLines) flush() {
	if l.partial != "" {
		l.line(l.partial)
		l.partial = ""
	}
}

func (l *logLines) line(s string) {
	if rest, ok := strings.CutPrefix(s, "[stdout] "); ok {
		io.WriteString(l.stdout, rest)
		return
	}
	io.WriteString(l.stderr, strings.TrimPrefix(s, "[stderr] "))
}

// runOutcome is what decides how a run ended, of its record.
type runOutcome struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Output *struct {
		ExitCode *int   `json:"exitCode"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	} `json:"output"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// runRecord is run id as GET /api/tasks/runs?runId= answers it: the JSON
// object whole (fields the server adds included), and its outcome.
func (c *apiClient) runRecord(ctx context.Context, id, account string) (json.RawMessage, runOutcome, error) {
	var run runOutcome
	cl, err := c.api()
	if err != nil {
		return nil, run, err
	}
	res, err := client.Check(cl.GetTasksRunsWithResponse(ctx, &client.GetTasksRunsParams{RunID: &id, AccountID: optional(account)}))
	if err != nil {
		return nil, run, err
	}
	var body struct {
		Runs []json.RawMessage `json:"runs"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || len(body.Runs) != 1 {
		return nil, run, fmt.Errorf("decode answer: %d runs (%v)", len(body.Runs), err)
	}
	if err := json.Unmarshal(body.Runs[0], &run); err != nil {
		return nil, run, fmt.Errorf("decode answer: %w", err)
	}
	return body.Runs[0], run, nil
}

// exitCode is the run's command's exit code; 0 when it has none (a task).
func (r runOutcome) exitCode() int {
	if r.Output == nil || r.Output.ExitCode == nil {
		return 0
	}
	return *r.Output.ExitCode
}

// showKept writes the output the run's record keeps (the first 256 KiB of
// each stream), for a run whose log the server no longer has.
func (r runOutcome) showKept(std stdio) {
	if r.Output == nil || r.Output.Stdout == "" && r.Output.Stderr == "" {
		return
	}
	fmt.Fprintf(std.err, "sandboxd: the log of %s is not kept; its record's output follows\n", r.ID)
	io.WriteString(std.out, r.Output.Stdout)
	io.WriteString(std.err, r.Output.Stderr)
}

// outcome is the CLI's result for a run that ended: nil when it succeeded
// (a command that exited 0), else an exitError with the command's exit
// code (1 when it has none), the reason said on stderr unless quiet.
func (r runOutcome) outcome(stderr io.Writer, quiet bool) error {
	code := r.exitCode()
	if r.Status == "COMPLETED" && code == 0 {
		return nil
	}
	if !quiet {
		var msg bytes.Buffer
		if r.Status == "COMPLETED" {
			fmt.Fprintf(&msg, "sandboxd: run %s: its command exited with status %d", r.ID, code)
		} else {
			fmt.Fprintf(&msg, "sandboxd: run %s %s", r.ID, r.Status)
			if r.Error != nil && r.Error.Message != "" {
				fmt.Fprintf(&msg, ": %s", r.Error.Message)
			}
			if code != 0 {
				fmt.Fprintf(&msg, " (its command exited with status %d)", code)
			}
		}
		msg.WriteByte('\n')
		_, _ = msg.WriteTo(stderr)
	}
	return &exitError{code: max(code, 1)}
}
