package main

import (
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

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// apiClient is the CLI's client for a running sandboxd: the generated Go
// client (package client) for the JSON routes and the upload's multipart
// form (upload.go), and its URL, key and HTTP client for the two streams
// the generated code does not express (exec's Server-Sent Events are read
// here, the exec websocket in connect.go).
type apiClient struct {
	url, key string
	http     *http.Client
}

// api returns the generated client for the flags' URL and key.
func (c *apiClient) api() (*client.ClientWithResponses, error) {
	return client.New(c.url, c.key, client.WithHTTPClient(namedErrors{c.http}))
}

// namedErrors is the CLI's HTTP client: a request that gets no answer
// fails with its method and path first ("POST /api/sandboxes: ..."), as
// the CLI's errors always began.
type namedErrors struct{ http *http.Client }

func (d namedErrors) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.RequestURI(), err)
	}
	return resp, nil
}

// waitFor runs call, an API call that may take a while (a create from a
// large snapshot, a fork, a resume), as a task of tracker, which shows the
// wait when it is long.
func waitFor[T any](tracker progress.Tracker, title string, call func() (T, error)) (T, error) {
	task := tracker.Start(title, progress.Steps, 0)
	v, err := call()
	task.Done(err)
	return v, err
}

// decoded is the body of a successful answer, which the generated client
// leaves nil when the server answered something other than JSON.
func decoded[T any](v *T) (*T, error) {
	if v == nil {
		return nil, errors.New("decode answer: the answer is not JSON")
	}
	return v, nil
}

// optional is nil for an unset flag, which the request then omits.
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// deref is what the CLI prints for an optional field: "" when absent.
func deref[T any](v *T) T {
	if v == nil {
		var zero T
		return zero
	}
	return *v
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

// The CLI decodes the API's answers into the generated client's types,
// which come from the document the server serves: a field renamed there
// breaks this build (after go generate) rather than, silently, the CLI.
// Their fields are in the server's order (the document's x-order), so
// --json prints what it always printed.

func printSandboxes(w io.Writer, sbs []client.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tREMAINING\tRUNTIME\tCREATED\tRUN")
	for _, s := range sbs {
		remaining := (time.Duration(s.Timeout) * time.Millisecond).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SandboxID, s.SandboxStatus, remaining, deref(s.Runtime), s.CreatedAt, deref(s.RunID))
	}
	return tw.Flush()
}

// listPage is how many sandboxes `sandbox ls --all` asks for at a time.
const listPage = 100

// listSandboxes is GET /api/sandboxes: its one answer, or with all the
// whole list, page after page (the account's environment as the first
// page gives it).
func listSandboxes(ctx context.Context, cl *client.ClientWithResponses, account string, all bool) (*client.ListSandboxesResponse, error) {
	params := &client.GetSandboxesParams{AccountID: optional(account)}
	if all {
		params.Limit = optional(listPage)
	}
	var out *client.ListSandboxesResponse
	for {
		res, err := client.Check(cl.GetSandboxesWithResponse(ctx, params))
		if err != nil {
			return nil, err
		}
		page, err := decoded(res.JSON200)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = page
		} else {
			out.Sandboxes = append(out.Sandboxes, page.Sandboxes...)
		}
		var next string
		if res.Headers200 != nil {
			next = deref(res.Headers200.XNextCursor)
		}
		if !all || next == "" {
			return out, nil
		}
		params.Cursor = &next
	}
}

// clientFlags are the flags every `sandboxd sandbox` command shares.
type clientFlags struct {
	account string // act for this account (organization keys)
	asJSON  bool   // print JSON, errors included
}

// newSandboxCmd is the API client: `sandboxd sandbox create|ls|exec|stop`.
// g gives the log format its progress lines follow.
func newSandboxCmd(g *globals) *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	cmd := &cobra.Command{Use: "sandbox", Short: "Create, list, use and stop sandboxes through a running server's API"}
	registerAPIFlags(cmd, c, f, true)

	// act is a command that acts on one sandbox (POST
	// /api/sandboxes/ID/VERB) and prints the sandbox it answers; doing
	// names the wait ("pausing").
	type actCall func(ctx context.Context, cl *client.ClientWithResponses, id string, body client.AccountRequest) (*client.SandboxResponse, error)
	act := func(verb, doing, short string, call actCall) *cobra.Command {
		return &cobra.Command{
			Use:               verb + " SANDBOX_ID",
			Short:             short,
			Example:           fmt.Sprintf("  sandboxd sandbox %s sbx_123\n  sandboxd sandbox %s --json sbx_123", verb, verb),
			Args:              cobra.ExactArgs(1),
			ValidArgsFunction: c.sandboxIDs(f, true),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, err := c.api()
				if err != nil {
					return err
				}
				body := client.AccountRequest{AccountID: optional(f.account)}
				waits := g.waitTracker(cmd.ErrOrStderr(), f.asJSON)
				out, err := waitFor(waits, doing+" "+args[0], func() (*client.SandboxResponse, error) {
					return call(cmd.Context(), cl, args[0], body)
				})
				if err != nil {
					return err
				}
				return printSandbox(cmd.OutOrStdout(), out.Sandbox, f.asJSON)
			},
		}
	}
	stop := act("stop", "stopping", "Stop a sandbox", func(ctx context.Context, cl *client.ClientWithResponses, id string, body client.AccountRequest) (*client.SandboxResponse, error) {
		res, err := client.Check(cl.PostSandboxesIDStopWithResponse(ctx, id, body))
		if err != nil {
			return nil, err
		}
		return decoded(res.JSON200)
	})
	var pauseMemory bool
	pause := act("pause", "pausing", "Pause a running sandbox with its memory (or its files alone: --memory=false): it stops running and its timeout stops", func(ctx context.Context, cl *client.ClientWithResponses, id string, body client.AccountRequest) (*client.SandboxResponse, error) {
		req := client.PauseRequest{AccountID: body.AccountID}
		if !pauseMemory {
			req.Memory = &pauseMemory
		}
		res, err := client.Check(cl.PostSandboxesIDPauseWithResponse(ctx, id, req))
		if err != nil {
			return nil, err
		}
		return decoded(res.JSON200)
	})
	pause.Long = "Pause a running sandbox. By default its memory and processes are kept on its node and a resume brings it back\n" +
		"where it was. With --memory=false its files alone are kept, in the blob store: its processes end, and a resume\n" +
		"(on any node of a cluster) starts it again from its files, its processes afresh."
	pause.Example += "\n  sandboxd sandbox pause --memory=false sbx_123"
	pause.Flags().BoolVar(&pauseMemory, "memory", true, "keep the memory and processes; false keeps the files alone (resumed on any node)")
	resume := act("resume", "resuming", "Resume a paused sandbox where it was", func(ctx context.Context, cl *client.ClientWithResponses, id string, body client.AccountRequest) (*client.SandboxResponse, error) {
		res, err := client.Check(cl.PostSandboxesIDResumeWithResponse(ctx, id, body))
		if err != nil {
			return nil, err
		}
		return decoded(res.JSON200)
	})
	var count int
	var timeout time.Duration
	fork := &cobra.Command{
		Use:   "fork SANDBOX_ID",
		Short: "Start sandboxes from a running sandbox's memory and filesystem",
		Long: "Start --count new sandboxes, each a copy of the running sandbox at one moment (its processes with their memory,\n" +
			"its files, its network policy); the sandbox itself runs on. All are started or none.",
		Example: "  sandboxd sandbox fork sbx_123\n" +
			"  sandboxd sandbox fork sbx_123 --count 3 --timeout 1h --json",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := client.ForkRequest{Count: optional(count), Timeout: optional(int(timeout.Milliseconds())), AccountID: optional(f.account)}
			cl, err := c.api()
			if err != nil {
				return err
			}
			waits := g.waitTracker(cmd.ErrOrStderr(), f.asJSON)
			out, err := waitFor(waits, fmt.Sprintf("forking %s (%d)", args[0], count), func() (*client.SandboxesResponse, error) {
				res, err := client.Check(cl.PostSandboxesIDForkWithResponse(cmd.Context(), args[0], body))
				if err != nil {
					return nil, err
				}
				return decoded(res.JSON200)
			})
			if err != nil {
				return err
			}
			if f.asJSON {
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
		Example: "  sandboxd sandbox network sbx_123 egress\n" +
			"  sandboxd sandbox network sbx_123 allow=192.0.2.0/24,example.com,*.pypi.org\n" +
			"  sandboxd sandbox network sbx_123 none",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := networkFlag(args[1])
			if err != nil {
				return err
			}
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PatchSandboxesIDNetworkWithResponse(cmd.Context(), args[0], client.NetworkRequest{Network: p, AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			return printSandbox(cmd.OutOrStdout(), out.Sandbox, f.asJSON)
		},
	}
	cmd.AddCommand(createCommand(g, c, f), lsCommand(c, f), execCommand(c, f), stop, pause, resume, fork, setNetwork, uploadCommand(g, c, &f.asJSON))
	cmd.AddCommand(processCommands(c, f)...)
	cmd.AddCommand(timeoutCommands(c, f)...)
	cmd.AddCommand(logsCommand(c, f), inspectCommand(c, f), rmCommand(c, f), cpCommand(c, f))
	cmd.AddCommand(connectCommand(c, f), codeCommand(c, f), codeContextCommands(c, f), sandboxSnapshotCommand(g, c, f))
	return cmd
}

// printSandbox prints one sandbox as JSON or as a one-row table.
func printSandbox(w io.Writer, sb client.Sandbox, asJSON bool) error {
	if asJSON {
		return printJSON(w, sb)
	}
	return printSandboxes(w, []client.Sandbox{sb})
}

// networkFlagUsage says what --network and `sandbox network` take.
const networkFlagUsage = `network policy: none, egress, allow=CIDR|ADDRESS|DOMAIN,... or the API's JSON ({"allow": [...]})`

// networkFlag is parseNetworkFlag's policy as the client sends it.
func networkFlag(s string) (client.NetworkPolicy, error) {
	var out client.NetworkPolicy
	p, err := parseNetworkFlag(s)
	if err != nil {
		return out, err
	}
	// The client's policy is a union of the document's two forms (a
	// string, an object); netpol writes the right one.
	data, err := json.Marshal(p)
	if err != nil {
		return out, err
	}
	return out, out.UnmarshalJSON(data)
}

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
