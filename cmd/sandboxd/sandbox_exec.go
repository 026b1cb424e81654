package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/capbuf"
)

// maxWholeStdin is the most input `exec --keep-running -i` sends in the
// body's stdin field (a command left running cannot have its input
// streamed): the API takes JSON bodies of 1 MiB, escapes included.
const maxWholeStdin = 768 << 10

// maxExecOutput is what `exec --json` keeps of each stream of a command
// whose input it streamed, as the API's whole answer does.
const maxExecOutput = 1 << 20

// outputNote ends a stream that exec --json cut at maxExecOutput, as the
// API's note does.
const outputNote = "not shown; stream the exec to see all"

// execCommand is `sandboxd sandbox exec ID -- COMMAND...`: a command in a
// running sandbox, its output streamed and its exit status the CLI's.
func execCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var (
		cwd                string
		keepRunning, stdin bool
		timeout            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec SANDBOX_ID [flags] -- COMMAND [ARGS...]",
		Short: "Run a command in a running sandbox, streaming its output; the exit status is the command's",
		Long: "Run a command in a running sandbox. Its stdout and stderr are streamed to this one's and its exit\n" +
			"status is this one's (with --json too, after the answer is printed). When stdin is a pipe or a file\n" +
			"(or with -i) it is streamed to the command as its input; --stdin=false sends none. --timeout kills\n" +
			"the command after that long and says so. Ctrl-C stops the command with this client unless\n" +
			"--keep-running leaves it to the sandbox; such a command gets input only with -i, sent whole (UTF-8\n" +
			"text, up to 768 KiB).",
		Example: "  sandboxd sandbox exec sbx_123 -- python3 -c 'print(6*7)'\n" +
			"  echo hello | sandboxd sandbox exec sbx_123 -- tr a-z A-Z\n" +
			"  sandboxd sandbox exec --timeout 30s --json sbx_123 -- make test",
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			run := remoteCommand{argv: args[1:], cwd: cwd, timeout: timeout, keepRunning: keepRunning}
			forward := stdin
			if !cmd.Flags().Changed("stdin") {
				// A command left running cannot have its input
				// streamed, and one read whole could wait forever
				// for a pipe that never closes: only -i sends it.
				forward = !keepRunning && hasInput(cmd.InOrStdin())
			}
			std := stdio{cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()}
			switch {
			case forward && keepRunning:
				in, err := wholeInput(std.in)
				if err != nil {
					return err
				}
				run.stdin = &in
			case forward:
				// Only the websocket streams input while output
				// comes; the command ends it, whether or not it
				// read it all.
				return c.execStreamingInput(cmd.Context(), args[0], f, run, std)
			}
			return c.execRequest(cmd.Context(), args[0], f, run, std)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cwd, "cwd", "", "working directory")
	fl.BoolVar(&keepRunning, "keep-running", false, "leave the command running in the sandbox when this client stops (Ctrl-C); by default it is killed with it")
	fl.BoolVarP(&stdin, "stdin", "i", false, "stream this one's stdin to the command (the default when it is a pipe or a file, without --keep-running; --stdin=false sends none)")
	fl.DurationVar(&timeout, "timeout", 0, "kill the command after this long (default: the sandbox's remaining lifetime)")
	return cmd
}

// remoteCommand is what `exec` runs.
type remoteCommand struct {
	argv        []string
	cwd         string
	timeout     time.Duration
	keepRunning bool
	stdin       *string // the whole input, when sent in the body
}

// body is the command as POST .../exec takes it.
func (r remoteCommand) body(account string) client.ExecRequest {
	// A terminal's Ctrl-C ends the remote command too, as with ssh, unless
	// --keep-running leaves it to the sandbox.
	kill := !r.keepRunning
	b := client.ExecRequest{Command: r.argv[0], Cwd: optional(r.cwd), AccountID: optional(account), KillOnDisconnect: &kill, Stdin: r.stdin}
	if rest := r.argv[1:]; len(rest) > 0 {
		b.Args = &rest
	}
	if r.timeout > 0 {
		b.Timeout = optional(int(max(1, r.timeout.Milliseconds())))
	}
	return b
}

// ended reports how the command ended, on stderr where the exit code
// alone would not say it, and returns the CLI's error for it: its exit
// status.
func (r remoteCommand) ended(stderr io.Writer, code int, oom, timedOut, quiet bool) error {
	if !quiet {
		switch {
		case oom:
			io.WriteString(stderr, "sandboxd: killed: the sandbox ran out of memory\n")
		case timedOut && r.timeout > 0:
			fmt.Fprintf(stderr, "sandboxd: killed: the command ran past its --timeout (%v)\n", r.timeout)
		case timedOut:
			io.WriteString(stderr, "sandboxd: killed: the sandbox reached its timeout while the command ran\n")
		}
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// execRequest runs the command through POST .../exec: the whole answer
// with --json, else its events as they come.
func (c *apiClient) execRequest(ctx context.Context, id string, f *clientFlags, r remoteCommand, std stdio) error {
	cl, err := c.api()
	if err != nil {
		return err
	}
	body := r.body(f.account)
	if f.asJSON {
		res, err := client.Check(cl.PostSandboxesIDExecWithResponse(ctx, id, body))
		if err != nil {
			return err
		}
		out, err := decoded(res.JSON200)
		if err != nil {
			return err
		}
		if err := printJSONSorted(std.out, out); err != nil {
			return err
		}
		return r.ended(std.err, out.ExitCode, deref(out.OomKilled), deref(out.TimedOut), true)
	}
	exit, err := execStream(ctx, cl, id, body, std.out, std.err)
	if err != nil {
		return err
	}
	return r.ended(std.err, exit.ExitCode, exit.OOMKilled, exit.TimedOut, false)
}

// execStreamingInput runs the command over the exec websocket, which
// carries this side's input as it comes (POST .../exec takes it whole).
// With --json its output is collected into the answer POST would give.
func (c *apiClient) execStreamingInput(ctx context.Context, id string, f *clientFlags, r remoteCommand, std stdio) error {
	body := api.ExecRequest{Command: r.argv[0], Args: r.argv[1:], Cwd: r.cwd, AccountID: f.account}
	if r.timeout > 0 {
		body.Timeout = max(1, r.timeout.Milliseconds())
	}
	streams := std
	stdout, stderr := capbuf.New(maxExecOutput), capbuf.New(maxExecOutput)
	if f.asJSON {
		streams.out, streams.err = stdout, stderr
	}
	start := time.Now()
	end, err := c.connect(ctx, id, f.account, body, false, streams)
	if err != nil {
		return err
	}
	if f.asJSON {
		out := api.ExecResponse{
			Status: "success", ExitCode: end.ExitCode, OOMKilled: end.OOMKilled, TimedOut: end.TimedOut,
			Stdout: stdout.String(outputNote), Stderr: stderr.String(outputNote), DurationMs: time.Since(start).Milliseconds(),
		}
		if err := printJSONSorted(std.out, out); err != nil {
			return err
		}
	}
	return r.ended(std.err, end.ExitCode, end.OOMKilled, end.TimedOut, f.asJSON)
}

// hasInput says whether in has input to send: a pipe, a file or a socket;
// not a terminal (someone would have to type into a command that may never
// read) nor /dev/null. A reader that is not a file was given on purpose.
func hasInput(in io.Reader) bool {
	f, ok := in.(*os.File)
	if !ok {
		return true
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	m := fi.Mode()
	return m.IsRegular() || m&(os.ModeNamedPipe|os.ModeSocket) != 0
}

// wholeInput reads in for the body's stdin field: text, at most
// maxWholeStdin bytes.
func wholeInput(in io.Reader) (string, error) {
	data, err := io.ReadAll(io.LimitReader(in, maxWholeStdin+1))
	if err != nil {
		return "", fmt.Errorf("read stdin: %w", err)
	}
	switch {
	case len(data) > maxWholeStdin:
		return "", fmt.Errorf("stdin is longer than %d KiB, the most exec --keep-running sends (whole); without --keep-running it is streamed", maxWholeStdin>>10)
	case !utf8.Valid(data):
		return "", errors.New("stdin is not UTF-8 text, which exec --keep-running sends (whole, in JSON); without --keep-running it is streamed as it is")
	}
	return string(data), nil
}

// exitError carries a remote command's exit code to the CLI's exit status.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

// execStream runs an exec as Server-Sent Events, copying output as it
// comes. The generated client sends the request (its plain variant
// leaves the answer unread); the events are read here, since the document
// gives the stream as text only.
func execStream(ctx context.Context, cl *client.ClientWithResponses, id string, body client.ExecRequest, stdout, stderr io.Writer) (api.ExecExit, error) {
	resp, err := cl.PostSandboxesIDExec(ctx, id, body, func(_ context.Context, req *http.Request) error {
		req.Header.Set("Accept", "text/event-stream")
		return nil
	})
	if err != nil {
		return api.ExecExit{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.ExecExit{}, errorAnswer(resp)
	}
	var exit api.ExecExit
	ended := false
	err = readEvents(resp.Body, func(event string, data []byte) (bool, error) {
		// Every event's data decodes into the one value; the event's name
		// says which part is meant.
		var d struct {
			api.ExecOutput
			api.ExecExit
			api.ExecFailure
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return false, fmt.Errorf("decode event: %w", err)
		}
		switch event {
		case "stdout":
			io.WriteString(stdout, d.Data)
		case "stderr":
			io.WriteString(stderr, d.Data)
		case "exit":
			exit, ended = d.ExecExit, true
			return true, nil
		case "error":
			return true, fmt.Errorf("exec: %s", d.Error)
		}
		return false, nil
	})
	if err == nil && !ended {
		err = errors.New("event stream ended without an exit event")
	}
	return exit, err
}

// errorAnswer is the *client.Error of an answer that is not a success.
func errorAnswer(resp *http.Response) error {
	e := &client.Error{StatusCode: resp.StatusCode}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e.Body)
	return e
}

// readEvents reads Server-Sent Events from r, handing each event's name and
// data to handle until it says it is done, or fails.
func readEvents(r io.Reader, handle func(event string, data []byte) (done bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			done, err := handle(event, []byte(strings.TrimPrefix(line, "data: ")))
			if done || err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read event stream: %w", err)
	}
	return nil
}
