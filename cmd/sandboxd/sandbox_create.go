package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// createWaitPoll is how often `create --wait` looks at a sandbox that is
// not running yet.
const createWaitPoll = 500 * time.Millisecond

// createOptions are the flags of `sandboxd sandbox create`.
type createOptions struct {
	timeout              time.Duration
	cwd, prompt, network string
	template             string
	snapshot             string
	onTimeout            string
	volumes              []string
	wait, follow         bool
}

// createCommand is `sandboxd sandbox create [-- COMMAND...]`: a sandbox,
// optionally running a command or a prompt, optionally waited for until it
// runs (--wait) or until its run ends (--follow).
func createCommand(g *globals, c *apiClient, f *clientFlags) *cobra.Command {
	var o createOptions
	cmd := &cobra.Command{
		Use:   "create [flags] [-- COMMAND ARGS...]",
		Short: "Create a sandbox, optionally running a command or a prompt in it",
		Long: "Create a sandbox from the account's snapshot (or fresh), or from a template (--template NAME[:TAG]: the\n" +
			"account's, else a public one; `sandboxd template ls`), or from a named snapshot of the account (--snapshot\n" +
			"NAME[:TAG]; `sandboxd snapshot ls`), optionally running COMMAND or --prompt in it as a\n" +
			"run. --wait returns once the sandbox runs (an error when it failed, with the reason); --follow also\n" +
			"follows the run's log to its end and exits with its command's status (the sandbox is named on stderr;\n" +
			"with --json the sandbox and the run's record are printed at the end). --on-timeout pause or pause-files pauses\n" +
			"it at its timeout instead of stopping it (see sandbox pause). --volume NAME:/path mounts a volume of the account\n" +
			"(`sandboxd volume ls`) at /path, read-write (one sandbox at a time) or, with :ro, read-only (any number).",
		Example: "  sandboxd sandbox create --timeout 30m\n" +
			"  sandboxd sandbox create --follow -- python3 -c 'print(6*7)'\n" +
			"  sandboxd sandbox create --network allow=pypi.org,*.pythonhosted.org --json\n" +
			"  sandboxd sandbox create --template py:3.12 --wait\n" +
			"  sandboxd sandbox create --snapshot deps-installed --wait\n" +
			"  sandboxd sandbox create --timeout 1h --on-timeout pause-files\n" +
			"  sandboxd sandbox create --volume data:/data --volume models:/models:ro --wait",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.follow && len(args) == 0 && o.prompt == "" {
				return errors.New("--follow needs a COMMAND or --prompt: a sandbox without one has no run to follow")
			}
			body, err := o.body(args, f.account)
			if err != nil {
				return err
			}
			sb, err := c.create(cmd, g, f, body)
			if err != nil {
				return err
			}
			if o.wait || o.follow {
				if sb, err = c.waitRunning(cmd.Context(), *sb, f.account); err != nil {
					return err
				}
			}
			if o.follow {
				return c.followCreated(cmd, f, *sb)
			}
			return printSandbox(cmd.OutOrStdout(), *sb, f.asJSON)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&o.timeout, "timeout", 0, "lifetime (default: the server's, 10m)")
	fl.StringVar(&o.cwd, "cwd", "", "working directory of the command")
	fl.StringVar(&o.prompt, "prompt", "", "run opencode with this prompt instead of a command")
	fl.StringVar(&o.network, "network", "", networkFlagUsage)
	fl.StringVar(&o.template, "template", "", "start from this template, NAME[:TAG] (the account's, else a public one; it must be ready), not the account's snapshot")
	// SANDBOXD_TEMPLATE is serve's image, never this flag.
	_ = fl.SetAnnotation("template", noEnv, []string{"true"})
	_ = cmd.RegisterFlagCompletionFunc("template", c.templateRefs(true))
	fl.StringVar(&o.snapshot, "snapshot", "", "start from this named snapshot of the account, NAME[:TAG] or id (see sandbox snapshot), not with --template")
	fl.StringVar(&o.onTimeout, "on-timeout", "", "what the timeout does: stop (the default), pause (memory kept) or pause-files (files kept; resumed on any node)")
	_ = cmd.RegisterFlagCompletionFunc("on-timeout", cobra.FixedCompletions([]string{"stop", "pause", "pause-files"}, cobra.ShellCompDirectiveNoFileComp))
	fl.StringArrayVar(&o.volumes, "volume", nil, "mount a volume of the account, NAME:/PATH or NAME:/PATH:ro (read-only); repeatable")
	_ = cmd.RegisterFlagCompletionFunc("volume", c.volumeMounts(f))
	fl.BoolVar(&o.wait, "wait", false, "return once the sandbox runs; fail, with the reason, when it failed")
	fl.BoolVar(&o.follow, "follow", false, "wait, then follow the run's log to its end and exit with its command's status")
	return cmd
}

// body is the create request of the flags and COMMAND.
func (o createOptions) body(args []string, account string) (client.CreateSandboxRequest, error) {
	body := client.CreateSandboxRequest{Prompt: optional(o.prompt), Cwd: optional(o.cwd), AccountID: optional(account), Template: optional(o.template), Snapshot: optional(o.snapshot)}
	if len(args) > 0 {
		// A command's args are sent even when there are none: the
		// server keeps them in the run's payload, where [] and null
		// differ.
		rest := args[1:]
		body.Command, body.Args = &args[0], &rest
	}
	if o.timeout > 0 {
		body.Timeout = optional(int(o.timeout.Milliseconds()))
	}
	if o.onTimeout != "" {
		v := client.CreateSandboxRequestOnTimeout(o.onTimeout)
		if !v.Valid() {
			return body, fmt.Errorf("--on-timeout %q: want stop, pause or pause-files", o.onTimeout)
		}
		body.OnTimeout = &v
	}
	if o.network != "" {
		p, err := networkFlag(o.network)
		if err != nil {
			return body, err
		}
		body.Network = &p
	}
	if len(o.volumes) > 0 {
		mounts := make([]client.VolumeMount, 0, len(o.volumes))
		for _, s := range o.volumes {
			m, err := volumeFlag(s)
			if err != nil {
				return body, err
			}
			mounts = append(mounts, m)
		}
		body.Volumes = &mounts
	}
	return body, nil
}

// volumeFlag reads a --volume: NAME:/PATH, or NAME:/PATH:ro for a
// read-only mount (:rw says read-write). The server checks the name and
// the path.
func volumeFlag(s string) (client.VolumeMount, error) {
	name, path, ok := strings.Cut(s, ":")
	readOnly := false
	if rest, mode, found := strings.Cut(path, ":"); found {
		switch mode {
		case "ro":
			readOnly = true
		case "rw":
		default:
			return client.VolumeMount{}, &flagError{flags: []string{"volume"}, err: fmt.Errorf("--volume %q: the mode after the path is ro or rw, not %q", s, mode)}
		}
		path = rest
	}
	if !ok || name == "" || !strings.HasPrefix(path, "/") {
		return client.VolumeMount{}, &flagError{flags: []string{"volume"}, err: fmt.Errorf("--volume %q: want NAME:/PATH or NAME:/PATH:ro", s)}
	}
	m := client.VolumeMount{Name: name, Path: path}
	if readOnly {
		m.ReadOnly = &readOnly
	}
	return m, nil
}

// volumeMounts completes a --volume's NAME: (the path is the user's).
func (c *apiClient) volumeMounts(f *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if strings.Contains(toComplete, ":") || applyEnv(cmd.Flags(), os.LookupEnv) != nil || c.key == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		vs, err := c.listVolumes(ctx, f.account)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, v := range vs {
			if strings.HasPrefix(v.Name, toComplete) {
				out = append(out, cobra.CompletionWithDesc(v.Name+":", fmt.Sprintf("%d MiB, %s", v.SizeMb, attachedTo(v))))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}

// create sends the create request, showing the wait when it is long.
func (c *apiClient) create(cmd *cobra.Command, g *globals, f *clientFlags, body client.CreateSandboxRequest) (*client.Sandbox, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	waits := g.waitTracker(cmd.ErrOrStderr(), f.asJSON)
	out, err := waitFor(waits, "creating a sandbox", func() (*client.SandboxesResponse, error) {
		res, err := client.Check(cl.PostSandboxesWithResponse(cmd.Context(), body))
		if err != nil {
			return nil, err
		}
		return decoded(res.JSON200)
	})
	if err != nil {
		return nil, err
	}
	if len(out.Sandboxes) != 1 {
		return nil, fmt.Errorf("decode answer: %d sandboxes, want 1", len(out.Sandboxes))
	}
	return &out.Sandboxes[0], nil
}

// waitRunning waits until sb has started (runs, or was paused since). A
// sandbox that failed or stopped meanwhile is an error with the reason the
// server gives (failureReason).
func (c *apiClient) waitRunning(ctx context.Context, sb client.Sandbox, account string) (*client.Sandbox, error) {
	tick := time.NewTicker(createWaitPoll)
	defer tick.Stop()
	for {
		switch sb.SandboxStatus {
		case "running", "pausing", "paused":
			// Someone paused it meanwhile: it started, and a
			// resume (or an exec) brings it back.
			return &sb, nil
		case "stopped", "failed", "stopping":
			return nil, c.notRunning(ctx, sb, account)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		raw, err := c.sandboxObject(ctx, sb.SandboxID, account)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &sb); err != nil {
			return nil, fmt.Errorf("decode answer: %w", err)
		}
	}
}

// notRunning is the error for a sandbox that ended before it ran, with its
// failureReason when the server says one.
func (c *apiClient) notRunning(ctx context.Context, sb client.Sandbox, account string) error {
	msg := fmt.Sprintf("sandbox %s is %s", sb.SandboxID, sb.SandboxStatus)
	if raw, err := c.sandboxObject(ctx, sb.SandboxID, account); err == nil {
		var why struct {
			FailureReason string `json:"failureReason"`
		}
		if json.Unmarshal(raw, &why) == nil && why.FailureReason != "" {
			msg += ": " + why.FailureReason
		}
	}
	return errors.New(msg)
}

// followCreated follows the run a create started to its end.
func (c *apiClient) followCreated(cmd *cobra.Command, f *clientFlags, sb client.Sandbox) error {
	run := deref(sb.RunID)
	if run == "" {
		return fmt.Errorf("sandbox %s was created without a run to follow", sb.SandboxID)
	}
	std := stdio{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}
	if !f.asJSON {
		fmt.Fprintf(std.err, "sandboxd: sandbox %s runs; following its run %s\n", sb.SandboxID, run)
	}
	return c.waitForRun(cmd.Context(), run, f, std, func(r json.RawMessage) any {
		return struct {
			Sandbox client.Sandbox  `json:"sandbox"`
			Run     json.RawMessage `json:"run"`
		}{sb, r}
	})
}
