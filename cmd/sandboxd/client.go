package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// apiClient is the CLI's HTTP client for a running sandboxd.
type apiClient struct {
	url, key string
	http     *http.Client
}

// apiError is an error answer of the API.
type apiError struct {
	Status int
	Body   api.ErrorBody
}

func (e *apiError) Error() string {
	if e.Body.Error == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body.Error)
}

// do sends a JSON request and decodes a JSON answer into out.
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.send(ctx, method, path, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &apiError{Status: resp.StatusCode}
		_ = json.Unmarshal(data, &e.Body)
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}

func (c *apiClient) send(ctx context.Context, method, path string, body any, accept string) (*http.Response, error) {
	if body == nil {
		return c.sendBody(ctx, method, path, "", nil, accept)
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.sendBody(ctx, method, path, "application/json", bytes.NewReader(data), accept)
}

// sendBody sends a request whose body (nil: none) is of contentType.
func (c *apiClient) sendBody(ctx context.Context, method, path, contentType string, body io.Reader, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.url, "/")+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("x-api-key", c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp, nil
}

// doWait is do for a call that may take a while (a create from a large
// snapshot, a fork, a resume): tracker shows the wait when it is long.
func (c *apiClient) doWait(ctx context.Context, tracker progress.Tracker, title, method, path string, body, out any) error {
	task := tracker.Start(title, progress.Steps, 0)
	err := c.do(ctx, method, path, body, out)
	task.Done(err)
	return err
}

// newAPIHTTPClient returns the client the CLI talks to the API with. Go's
// client strips Authorization on a redirect to another host but not
// x-api-key: without this, a redirect (from a proxy, or a server that was
// told to) would hand the account's key to whatever host it names.
func newAPIHTTPClient() *http.Client {
	return &http.Client{CheckRedirect: keyStaysWithOrigin}
}

// keyStaysWithOrigin is a CheckRedirect that drops the credentials when a
// redirect leaves the origin (scheme, host and port) of the first request.
func keyStaysWithOrigin(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	first := via[0].URL
	if !strings.EqualFold(req.URL.Scheme, first.Scheme) || !strings.EqualFold(req.URL.Host, first.Host) {
		req.Header.Del("x-api-key")
		req.Header.Del("Authorization")
	}
	return nil
}

// The CLI decodes the API's answers into the API's own types, so renaming
// a field there breaks this build rather than, silently, the CLI.

func printSandboxes(w io.Writer, sbs []api.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tREMAINING\tRUNTIME\tCREATED\tRUN")
	for _, s := range sbs {
		remaining := (time.Duration(s.Timeout) * time.Millisecond).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SandboxID, s.SandboxStatus, remaining, s.Runtime, s.CreatedAt, s.RunID)
	}
	return tw.Flush()
}

// newSandboxCmd is the API client: `sandboxd sandbox create|ls|exec|stop`.
// g gives the log format its progress lines follow.
func newSandboxCmd(g *globals) *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	var asJSON bool
	var account string
	cmd := &cobra.Command{Use: "sandbox", Short: "Create, list, use and stop sandboxes through a running server's API"}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.url, "url", "http://127.0.0.1:8080", "server URL (env SANDBOXD_URL)")
	pf.StringVar(&c.key, "key", "", "API key (env SANDBOXD_API_KEY)")
	pf.BoolVar(&asJSON, "json", false, "print JSON")
	pf.StringVar(&account, "account", "", "act for this account id (organization keys)")
	requireKey := func(*cobra.Command, []string) error {
		if c.key == "" {
			return fmt.Errorf("no API key: pass --key or set SANDBOXD_API_KEY")
		}
		return nil
	}
	cmd.PersistentPreRunE = withEnv(requireKey)

	var timeout time.Duration
	var cwd, prompt, network string
	create := &cobra.Command{
		Use:   "create [-- COMMAND ARGS...]",
		Short: "Create a sandbox, optionally running a command or a prompt in it",
		RunE: func(cmd *cobra.Command, args []string) error {
			body := createBody{CreateSandboxRequest: api.CreateSandboxRequest{Prompt: prompt, Cwd: cwd, AccountID: account}}
			if len(args) > 0 {
				rest := args[1:]
				body.Command, body.Args = args[0], &rest
			}
			if timeout > 0 {
				body.Timeout = timeout.Milliseconds()
			}
			if network != "" {
				p, err := parseNetworkFlag(network)
				if err != nil {
					return err
				}
				body.Network = &p
			}
			var out api.SandboxesResponse
			waits := g.waitTracker(cmd.ErrOrStderr(), asJSON)
			if err := c.doWait(cmd.Context(), waits, "creating a sandbox", http.MethodPost, "/api/sandboxes", body, &out); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out.Sandboxes[0])
			}
			return printSandboxes(cmd.OutOrStdout(), out.Sandboxes)
		},
	}
	create.Flags().DurationVar(&timeout, "timeout", 0, "lifetime (default: the server's, 10m)")
	create.Flags().StringVar(&cwd, "cwd", "", "working directory of the command")
	create.Flags().StringVar(&prompt, "prompt", "", "run opencode with this prompt instead of a command")
	create.Flags().StringVar(&network, "network", "", networkFlagUsage)

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/api/sandboxes"
			if account != "" {
				path += "?account_id=" + account
			}
			var out api.ListSandboxesResponse
			if err := c.do(cmd.Context(), http.MethodGet, path, nil, &out); err != nil {
				return err
			}
			if asJSON {
				// The sandboxes and the environment, without the
				// file tree (which can be long), as --json has
				// always printed them.
				return printJSON(cmd.OutOrStdout(), struct {
					Sandboxes  []api.Sandbox `json:"sandboxes"`
					SnapshotID *string       `json:"snapshot_id"`
					GithubRepo *string       `json:"github_repo"`
				}{out.Sandboxes, out.SnapshotID, out.GithubRepo})
			}
			return printSandboxes(cmd.OutOrStdout(), out.Sandboxes)
		},
	}

	exec := &cobra.Command{
		Use:   "exec SANDBOX_ID -- COMMAND [ARGS...]",
		Short: "Run a command in a running sandbox, streaming its output",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := api.ExecRequest{Command: args[1], Args: args[2:], Cwd: cwd, AccountID: account}
			path := "/api/sandboxes/" + args[0] + "/exec"
			if asJSON {
				var out api.ExecResponse
				if err := c.do(cmd.Context(), http.MethodPost, path, body, &out); err != nil {
					return err
				}
				return printJSONSorted(cmd.OutOrStdout(), out)
			}
			code, err := c.execStream(cmd.Context(), path, body, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	exec.Flags().StringVar(&cwd, "cwd", "", "working directory")

	// act is a command that POSTs to /api/sandboxes/ID/VERB and prints
	// the sandbox it answers; doing names the wait ("pausing").
	act := func(verb, doing, short string) *cobra.Command {
		return &cobra.Command{
			Use:   verb + " SANDBOX_ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				body := api.AccountRequest{AccountID: account}
				var out api.SandboxResponse
				waits := g.waitTracker(cmd.ErrOrStderr(), asJSON)
				if err := c.doWait(cmd.Context(), waits, doing+" "+args[0], http.MethodPost, "/api/sandboxes/"+args[0]+"/"+verb, body, &out); err != nil {
					return err
				}
				return printSandbox(cmd.OutOrStdout(), out.Sandbox, asJSON)
			},
		}
	}
	stop := act("stop", "stopping", "Stop a sandbox")
	pause := act("pause", "pausing", "Pause a running sandbox with its memory: it stops running and its timeout stops")
	resume := act("resume", "resuming", "Resume a paused sandbox where it was")
	var count int
	fork := &cobra.Command{
		Use:   "fork SANDBOX_ID",
		Short: "Start sandboxes from a running sandbox's memory and filesystem",
		Long: "Start --count new sandboxes, each a copy of the running sandbox at one moment (its processes with their memory,\n" +
			"its files, its network policy); the sandbox itself runs on. All are started or none.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := api.ForkRequest{Count: count, Timeout: timeout.Milliseconds(), AccountID: account}
			var out api.SandboxesResponse
			waits := g.waitTracker(cmd.ErrOrStderr(), asJSON)
			if err := c.doWait(cmd.Context(), waits, fmt.Sprintf("forking %s (%d)", args[0], count), http.MethodPost, "/api/sandboxes/"+args[0]+"/fork", body, &out); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out.Sandboxes)
			}
			return printSandboxes(cmd.OutOrStdout(), out.Sandboxes)
		},
	}
	fork.Flags().IntVar(&count, "count", 1, "how many sandboxes to start")
	fork.Flags().DurationVar(&timeout, "timeout", 0, "lifetime of each (default: the server's, 10m)")
	setNetwork := &cobra.Command{
		Use:   "network SANDBOX_ID POLICY",
		Short: "Replace a running sandbox's network policy, without restarting it",
		Long: "Replace a running sandbox's network policy. It takes effect at once for new and open connections.\n" +
			"POLICY is " + networkFlagUsage + ".",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parseNetworkFlag(args[1])
			if err != nil {
				return err
			}
			body := api.NetworkRequest{Network: p, AccountID: account}
			var out api.SandboxResponse
			if err := c.do(cmd.Context(), http.MethodPatch, "/api/sandboxes/"+args[0]+"/network", body, &out); err != nil {
				return err
			}
			return printSandbox(cmd.OutOrStdout(), out.Sandbox, asJSON)
		},
	}
	cmd.AddCommand(create, ls, exec, stop, pause, resume, fork, setNetwork, uploadCommand(g, c, &asJSON))
	cmd.AddCommand(processCommands(c, &account, &asJSON)...)
	cmd.AddCommand(connectCommand(c, &account))
	return cmd
}

// printSandbox prints one sandbox as JSON or as a one-row table.
func printSandbox(w io.Writer, sb api.Sandbox, asJSON bool) error {
	if asJSON {
		return printJSON(w, sb)
	}
	return printSandboxes(w, []api.Sandbox{sb})
}

// networkFlagUsage says what --network and `sandbox network` take.
const networkFlagUsage = `network policy: none, egress, allow=CIDR|ADDRESS|DOMAIN,... or the API's JSON ({"allow": [...]})`

// parseNetworkFlag reads a policy as the CLI takes it and checks it as
// the server will.
func parseNetworkFlag(s string) (netpol.Policy, error) {
	var p netpol.Policy
	switch s = strings.TrimSpace(s); {
	case strings.HasPrefix(s, "{"), strings.HasPrefix(s, `"`):
		if err := json.Unmarshal([]byte(s), &p); err != nil {
			return p, fmt.Errorf("--%w", err)
		}
		return p, nil
	case strings.HasPrefix(s, "allow="):
		p = netpol.Policy{Mode: netpol.ModeAllow}
		for _, a := range strings.Split(strings.TrimPrefix(s, "allow="), ",") {
			if a = strings.TrimSpace(a); a != "" {
				p.Allow = append(p.Allow, a)
			}
		}
	default:
		p = netpol.Policy{Mode: netpol.Mode(s)}
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("--%w", err)
	}
	return p, nil
}

// createBody is the body of `sandbox create`. A command's args are sent
// even when there are none: the server keeps them in the run's payload,
// where [] and null differ, and the API type omits an empty list.
type createBody struct {
	api.CreateSandboxRequest
	Args *[]string `json:"args,omitempty"`
}

// exitError carries a remote command's exit code to the CLI's exit status.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

// execStream runs an exec as Server-Sent Events, copying output as it comes.
func (c *apiClient) execStream(ctx context.Context, path string, body any, stdout, stderr io.Writer) (int, error) {
	resp, err := c.send(ctx, http.MethodPost, path, body, "text/event-stream")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e := &apiError{Status: resp.StatusCode}
		_ = json.NewDecoder(resp.Body).Decode(&e.Body)
		return 0, e
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			// Every event's data decodes into the one value; the
			// event's name says which part is meant.
			var d struct {
				api.ExecOutput
				api.ExecExit
				api.ExecFailure
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				return 0, fmt.Errorf("decode event: %w", err)
			}
			switch event {
			case "stdout":
				io.WriteString(stdout, d.Data)
			case "stderr":
				io.WriteString(stderr, d.Data)
			case "exit":
				if d.OOMKilled {
					io.WriteString(stderr, "sandboxd: killed: the sandbox ran out of memory\n")
				}
				return d.ExitCode, nil
			case "error":
				return 0, fmt.Errorf("exec: %s", d.Error)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read event stream: %w", err)
	}
	return 0, fmt.Errorf("event stream ended without an exit event")
}

// printJSONSorted is printJSON with the object keys in alphabetical order:
// `exec --json` printed the answer decoded into a map, whose keys
// encoding/json sorts, and scripts may compare that output byte for byte.
func printJSONSorted(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	return printJSON(w, m)
}
