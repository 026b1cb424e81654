package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// templatePoll is how often `template build --wait` and `template logs
// --follow` look at a template that is building (a variable for the
// tests).
var templatePoll = time.Second

// newTemplateCmd is `sandboxd template build|ls|inspect|logs|rm`: the
// account's templates (docs/TEMPLATES.md) through a running server's API,
// with the same flags, environment and output rules as `sandboxd sandbox`.
// A template is named by its id or by NAME[:TAG], which resolves as the
// server resolves a create's template: the account's own first, then a
// public one.
func newTemplateCmd() *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	cmd := &cobra.Command{Use: "template", Short: "Build, list, inspect and delete templates (sandboxes' root filesystems from OCI images)"}
	// No --account: the template routes act for the key's own account.
	registerAPIFlags(cmd, c, f, false)
	cmd.AddCommand(templateBuildCommand(c, f), templateLsCommand(c, f), templateInspectCommand(c, f),
		templateLogsCommand(c, f), templateRmCommand(c, f))
	return cmd
}

// registerAPIFlags gives a group of API commands the client's persistent
// flags (--url, --key, --json and, with account, --account) and requires a
// key before any of its commands runs.
func registerAPIFlags(cmd *cobra.Command, c *apiClient, f *clientFlags, account bool) {
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.url, "url", "http://127.0.0.1:8080", "server URL (env SANDBOXD_URL)")
	pf.StringVar(&c.key, "key", "", "API key (env SANDBOXD_API_KEY)")
	pf.BoolVar(&f.asJSON, "json", false, "print JSON (errors too: {\"error\", \"status\"} on stderr)")
	if account {
		pf.StringVar(&f.account, "account", "", "act for this account id (organization keys)")
	}
	requireKey := func(cmd *cobra.Command, _ []string) error {
		// A group of commands only prints its help.
		if c.key == "" && !cmd.HasSubCommands() {
			return fmt.Errorf("no API key: pass --key or set SANDBOXD_API_KEY")
		}
		return nil
	}
	cmd.PersistentPreRunE = withEnv(requireKey)
}

func templateBuildCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var image, dockerfile, stepsFile, startCmd, readyCmd, contextDir, fromTemplate, fromSandbox string
	var wait bool
	var reg registryFlags
	cmd := &cobra.Command{
		Use:   "build NAME[:TAG] (--image REF [--steps FILE] | --dockerfile FILE [--context DIR] | --from-template T [--steps FILE] | --from-sandbox ID) [--registry-username U --registry-password-stdin] [--start-cmd CMD] [--ready-cmd CMD] [--wait]",
		Short: "Build a template from an OCI image, with steps or a Dockerfile, over another template, or from a running sandbox",
		Long: "Start the build of template NAME[:TAG] (tag latest by default) from the OCI image REF\n" +
			"(host/repository[:tag|@digest]), with the steps of --steps (a JSON array of E2B's {\"type\", \"args\"}: RUN,\n" +
			"COPY, ENV, ARG, WORKDIR, USER), or from a Dockerfile (--dockerfile; its FROM is the image; - reads stdin)\n" +
			"whose COPY and ADD read the directory --context (packed without what its .dockerignore names, and\n" +
			"uploaded unless the server has it already; progress on stderr), or over another template\n" +
			"(--from-template NAME[:TAG] or id: its files, config and start and ready commands, which --steps,\n" +
			"--start-cmd and --ready-cmd extend or override).\n" +
			"--start-cmd and --ready-cmd are the template's start and ready commands. The server answers at once with\n" +
			"the template, building; --wait follows the build, its log lines on stderr as they come, and prints the\n" +
			"template once it is ready, or exits non-zero with the reason the build failed.\n" +
			"--from-sandbox ID saves a running sandbox's files (not its memory) as the template instead: the server\n" +
			"answers once the template is ready.\n\n" +
			"A private registry: --registry-username and the password (or access token) on stdin\n" +
			"(--registry-password-stdin) or in SANDBOXD_REGISTRY_PASSWORD; or a registry token alone on stdin\n" +
			"(--registry-token-stdin) or in SANDBOXD_REGISTRY_TOKEN. Never on the command line. The server keeps\n" +
			"them sealed until the build has pulled the image, then deletes them.",
		Example: "  sandboxd template build py:3.12 --image registry.example/library/python:3.12-slim --wait\n" +
			"  sandboxd template build tools --image registry.example/acme/tools@sha256:... --json\n" +
			"  sandboxd template build app:1 --dockerfile Dockerfile --wait\n" +
			"  sandboxd template build app:2 --dockerfile app/Dockerfile --context app --wait\n" +
			"  printf %s \"$TOKEN\" | sandboxd template build app:2 --image registry.example/acme/app:1 --registry-username bot --registry-password-stdin\n" +
			"  sandboxd template build app:3 --from-template app:1 --steps more.json --wait\n" +
			"  sandboxd template build snap:1 --from-sandbox sbx_123",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromSandbox != "" {
				if image != "" || dockerfile != "" || stepsFile != "" || fromTemplate != "" || startCmd != "" || readyCmd != "" {
					return fmt.Errorf("--from-sandbox is used alone: the template is the sandbox's files over what it started from")
				}
				return c.saveTemplate(cmd, f, fromSandbox, args[0])
			}
			body := client.BuildTemplateRequest{Name: args[0]}
			var err error
			switch {
			case dockerfile != "" && (image != "" || stepsFile != "" || fromTemplate != ""):
				return fmt.Errorf("--dockerfile is not used with --image, --steps or --from-template: its FROM is the image")
			case fromTemplate != "" && image != "":
				return fmt.Errorf("--from-template and --image: give one base, not both")
			case fromTemplate != "":
				body.FromTemplate = &fromTemplate
			case dockerfile != "":
				text, err := readInput(cmd, dockerfile)
				if err != nil {
					return fmt.Errorf("--dockerfile: %w", err)
				}
				s := string(text)
				body.Dockerfile = &s
			case contextDir != "":
				return fmt.Errorf("--context is the build context of a Dockerfile: give --dockerfile too")
			case image == "":
				return fmt.Errorf("--image (or --dockerfile, --from-template, --from-sandbox) is required: the base to build %s from", args[0])
			default:
				body.Image = &image
			}
			if stepsFile != "" {
				text, err := readInput(cmd, stepsFile)
				if err != nil {
					return fmt.Errorf("--steps: %w", err)
				}
				var steps []client.TemplateStep
				if err := json.Unmarshal(text, &steps); err != nil {
					return fmt.Errorf("--steps: not a JSON array of steps ({\"type\", \"args\"}): %w", err)
				}
				body.Steps = &steps
			}
			stdinTaken := dockerfile == "-" || stepsFile == "-"
			if body.Registry, err = reg.credentials(cmd, stdinTaken); err != nil {
				return err
			}
			if startCmd != "" {
				body.StartCmd = &startCmd
			}
			if readyCmd != "" {
				body.ReadyCmd = &readyCmd
			}
			var res *client.PostTemplatesResult
			if contextDir != "" {
				var progress io.Writer
				if !f.asJSON {
					progress = cmd.ErrOrStderr()
				}
				hash, err := c.uploadContext(cmd.Context(), contextDir, progress)
				if err != nil {
					return err
				}
				if res, err = c.postTemplateWithContext(cmd.Context(), body, hash); err != nil {
					return err
				}
			} else {
				cl, err := c.api()
				if err != nil {
					return err
				}
				if res, err = client.Check(cl.PostTemplatesWithResponse(cmd.Context(), body)); err != nil {
					return err
				}
			}
			out, err := decoded(res.JSON202)
			if err != nil {
				return err
			}
			t := out.Template
			if wait {
				if !f.asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "sandboxd: building template %s:%s (%s)\n", t.Name, t.Tag, t.ID)
				}
				// The log is progress here: stderr, stdout keeps the result.
				full, err := c.followTemplate(cmd.Context(), t.ID, cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				if err := buildFailed(full); err != nil {
					return err
				}
				full.Log = nil
				t = full
			}
			return printTemplate(cmd.OutOrStdout(), t, f.asJSON)
		},
	}
	cmd.Flags().StringVar(&image, "image", "", "the OCI image to build from: host/repository[:tag|@digest]")
	cmd.Flags().StringVar(&stepsFile, "steps", "", "a file of steps (JSON array of {\"type\", \"args\"}) run over the image; - reads stdin")
	cmd.Flags().StringVar(&dockerfile, "dockerfile", "", "a Dockerfile to build (its FROM is the image); - reads stdin")
	cmd.Flags().StringVar(&contextDir, "context", "", "the Dockerfile's build context: the directory its COPY and ADD read (honours its .dockerignore)")
	cmd.Flags().StringVar(&startCmd, "start-cmd", "", "the template's start command, run in each sandbox from it")
	cmd.Flags().StringVar(&readyCmd, "ready-cmd", "", "the template's ready command: a sandbox is running once it exits 0")
	cmd.Flags().StringVar(&fromTemplate, "from-template", "", "build over this template (NAME[:TAG] or id; the account's own or a public one)")
	cmd.Flags().StringVar(&fromSandbox, "from-sandbox", "", "save this running sandbox's files as the template (answered once ready)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the build, its log on stderr; fail, with the reason, when it failed")
	reg.register(cmd.Flags())
	return cmd
}

// saveTemplate is POST /api/sandboxes/{id}/template: sandbox id's files
// as template name, printed once ready.
func (c *apiClient) saveTemplate(cmd *cobra.Command, f *clientFlags, id, name string) error {
	cl, err := c.api()
	if err != nil {
		return err
	}
	res, err := client.Check(cl.PostSandboxesIDTemplateWithResponse(cmd.Context(), id, client.SaveTemplateRequest{Name: name}))
	if err != nil {
		return err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return err
	}
	t := out.Template
	t.Log = nil
	return printTemplate(cmd.OutOrStdout(), t, f.asJSON)
}

func templateLsCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the account's templates and the public ones",
		Long: "List the account's templates, then the public ones (the operator's), by name and tag: each with its\n" +
			"id, status (building, ready, failed) and image. --json prints the API's template objects.",
		Example: "  sandboxd template ls\n" +
			"  sandboxd template ls --json | jq -r '.[] | select(.status == \"ready\") | .name + \":\" + .tag'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := c.listTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), ts)
			}
			return printTemplates(cmd.OutOrStdout(), ts)
		},
	}
}

func templateInspectCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "inspect ID|NAME[:TAG]",
		Aliases: []string{"get"},
		Short:   "Show every field the API answers for one template (its digest, its image's config, why it failed)",
		Long: "Show every field the API answers for one template, in the API's order, one per line (the build's\n" +
			"log aside: `sandboxd template logs` prints it), or the API's JSON object, log included, with --json.",
		Example: "  sandboxd template inspect py:3.12\n" +
			"  sandboxd template get --json tpl_123 | jq .config.env",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.templateRefs(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := c.resolveTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			raw, err := c.templateObject(cmd.Context(), id)
			if err != nil {
				return err
			}
			if f.asJSON {
				var buf bytes.Buffer
				if err := json.Indent(&buf, raw, "", "  "); err != nil {
					return fmt.Errorf("decode answer: %w", err)
				}
				buf.WriteByte('\n')
				_, err := buf.WriteTo(cmd.OutOrStdout())
				return err
			}
			return printFields(cmd.OutOrStdout(), withoutField(raw, "log"))
		},
	}
}

func templateLogsCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID|NAME[:TAG] [--follow]",
		Short: "Print a template's build log (--follow: until the build ends)",
		Long: "Print the build log of a template (the server keeps its last 64 KiB). --follow prints new lines as they\n" +
			"come until the build ends, and exits non-zero with the reason when it failed. --json prints\n" +
			"{id, name, tag, status, failureReason, log} once (with --follow, once the build ended).",
		Example: "  sandboxd template logs py:3.12\n" +
			"  sandboxd template logs --follow tpl_123",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.templateRefs(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := c.resolveTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var t client.Template
			switch {
			case follow && !f.asJSON:
				t, err = c.followTemplate(cmd.Context(), id, cmd.OutOrStdout())
			case follow:
				t, err = c.followTemplate(cmd.Context(), id, io.Discard)
			default:
				t, err = c.getTemplate(cmd.Context(), id)
				if err == nil && !f.asJSON {
					_, err = io.WriteString(cmd.OutOrStdout(), deref(t.Log))
				}
			}
			if err != nil {
				return err
			}
			if f.asJSON {
				if err := printJSON(cmd.OutOrStdout(), struct {
					ID            string                `json:"id"`
					Name          string                `json:"name"`
					Tag           string                `json:"tag"`
					Status        client.TemplateStatus `json:"status"`
					FailureReason *string               `json:"failureReason"`
					Log           string                `json:"log"`
				}{t.ID, t.Name, t.Tag, t.Status, t.FailureReason, deref(t.Log)}); err != nil {
					return err
				}
			}
			if follow {
				return buildFailed(t)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print new lines until the build ends; fail, with the reason, when it failed")
	return cmd
}

func templateRmCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID|NAME[:TAG]...",
		Short: "Delete templates (refused while a running or paused sandbox started from one)",
		Long: "Delete templates of the account. The server refuses one that a running or paused sandbox started\n" +
			"from (409), and public ones (403). Prints each id deleted; the exit status is 1 when any was not.",
		Example: "  sandboxd template rm py:3.12\n" +
			"  sandboxd template rm --json tpl_123 tools",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.templateRefs(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			deleted := []client.Template{}
			failed := 0
			for _, ref := range args {
				t, err := c.removeTemplate(cmd.Context(), ref)
				if err != nil {
					reportError(cmd.ErrOrStderr(), fmt.Errorf("rm %s: %w", ref, err), f.asJSON)
					failed++
					continue
				}
				deleted = append(deleted, t)
				if !f.asJSON {
					fmt.Fprintln(cmd.OutOrStdout(), t.ID)
				}
			}
			if f.asJSON {
				if err := printJSON(cmd.OutOrStdout(), deleted); err != nil {
					return err
				}
			}
			if failed > 0 {
				// Each failure was reported as it happened.
				return &exitError{code: 1}
			}
			return nil
		},
	}
}

// listTemplates is GET /api/templates: the account's templates, then the
// public ones.
func (c *apiClient) listTemplates(ctx context.Context) ([]client.Template, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.GetTemplatesWithResponse(ctx))
	if err != nil {
		return nil, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return nil, err
	}
	if out.Templates == nil {
		return []client.Template{}, nil
	}
	return out.Templates, nil
}

// resolveTemplate is the id of the template ref names: an id the list has,
// else NAME[:TAG] (tag latest by default), the account's own before a
// public one, as the server resolves a create's template. A ref the list
// does not have is tried as an id (GET answers it or 404).
func (c *apiClient) resolveTemplate(ctx context.Context, ref string) (string, error) {
	ts, err := c.listTemplates(ctx)
	if err != nil {
		return "", err
	}
	if t, ok := findTemplate(ts, ref); ok {
		return t.ID, nil
	}
	if strings.HasPrefix(ref, "tpl_") {
		return ref, nil
	}
	return "", templateNotFound(ref)
}

// findTemplate finds ref among ts: by id, else by name and tag, the
// account's own before a public one.
func findTemplate(ts []client.Template, ref string) (client.Template, bool) {
	for _, t := range ts {
		if t.ID == ref {
			return t, true
		}
	}
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		tag = "latest"
	}
	var public *client.Template
	for i, t := range ts {
		if t.Name != name || t.Tag != tag {
			continue
		}
		if !t.Public {
			return t, true
		}
		if public == nil {
			public = &ts[i]
		}
	}
	if public != nil {
		return *public, true
	}
	return client.Template{}, false
}

// templateNotFound is the error for a name the list does not have, as the
// API's routes answer an unknown template.
func templateNotFound(ref string) error {
	return &client.Error{StatusCode: http.StatusNotFound, Body: client.ErrorBody{Status: client.ErrorBodyStatus("error"), Error: fmt.Sprintf("Template %s not found", ref)}}
}

// templateObject is GET /api/templates/{id}: the JSON object, every field
// of it (a field the server adds shows without a new CLI).
func (c *apiClient) templateObject(ctx context.Context, id string) (json.RawMessage, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.GetTemplatesIDWithResponse(ctx, id))
	if err != nil {
		return nil, err
	}
	var body struct {
		Template json.RawMessage `json:"template"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || len(body.Template) == 0 {
		return nil, fmt.Errorf("decode answer: %v", err)
	}
	return body.Template, nil
}

// getTemplate is GET /api/templates/{id}, log included.
func (c *apiClient) getTemplate(ctx context.Context, id string) (client.Template, error) {
	cl, err := c.api()
	if err != nil {
		return client.Template{}, err
	}
	res, err := client.Check(cl.GetTemplatesIDWithResponse(ctx, id))
	if err != nil {
		return client.Template{}, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return client.Template{}, err
	}
	return out.Template, nil
}

// followTemplate polls template id until its build ends, writing the new
// part of its log to w each time, and returns it as it ended.
func (c *apiClient) followTemplate(ctx context.Context, id string, w io.Writer) (client.Template, error) {
	var printed string
	tick := time.NewTicker(templatePoll)
	defer tick.Stop()
	for {
		t, err := c.getTemplate(ctx, id)
		if err != nil {
			return t, err
		}
		cur := deref(t.Log)
		if _, err := io.WriteString(w, newLog(printed, cur)); err != nil {
			return t, err
		}
		printed = cur
		if t.Status != client.TemplateStatusBuilding {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return t, ctx.Err()
		case <-tick.C:
		}
	}
}

// newLog is what cur, a build's log now, has that prev, the log as it was
// printed, did not. The server keeps the last 64 KiB of a log, so once it
// is longer cur no longer starts with prev: the new part is then what
// follows prev's last line in cur (all of cur when that is gone).
func newLog(prev, cur string) string {
	if strings.HasPrefix(cur, prev) {
		return cur[len(prev):]
	}
	tail := strings.TrimSuffix(prev, "\n")
	if i := strings.LastIndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	if tail != "" {
		if i := strings.LastIndex(cur, tail); i >= 0 {
			return strings.TrimPrefix(cur[i+len(tail):], "\n")
		}
	}
	return cur
}

// buildFailed is the error of a template whose build failed, with its
// reason; nil for one that did not.
func buildFailed(t client.Template) error {
	if t.Status != client.TemplateStatusFailed {
		return nil
	}
	reason := deref(t.FailureReason)
	if reason == "" {
		reason = "no reason was recorded"
	}
	return fmt.Errorf("template %s:%s (%s) failed to build: %s", t.Name, t.Tag, t.ID, reason)
}

// removeTemplate deletes the template ref names.
func (c *apiClient) removeTemplate(ctx context.Context, ref string) (client.Template, error) {
	id, err := c.resolveTemplate(ctx, ref)
	if err != nil {
		return client.Template{}, err
	}
	cl, err := c.api()
	if err != nil {
		return client.Template{}, err
	}
	res, err := client.Check(cl.DeleteTemplatesIDWithResponse(ctx, id))
	if err != nil {
		return client.Template{}, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return client.Template{}, err
	}
	return out.Template, nil
}

// printTemplate prints one template as JSON or as a one-row table.
func printTemplate(w io.Writer, t client.Template, asJSON bool) error {
	if asJSON {
		return printJSON(w, t)
	}
	return printTemplates(w, []client.Template{t})
}

func printTemplates(w io.Writer, ts []client.Template) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tPUBLIC\tIMAGE\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%t\t%s\t%s\n", t.ID, t.Name, t.Tag, t.Status, t.Public, t.Source, t.CreatedAt)
	}
	return tw.Flush()
}

// withoutField is the JSON object raw without its field key, in its own
// order; raw as it is when it is not an object.
func withoutField(raw json.RawMessage, key string) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return raw
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return raw
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return raw
		}
		if k == key {
			continue
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		name, _ := json.Marshal(k)
		buf.Write(name)
		buf.WriteByte(':')
		buf.Write(v)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// templateRefs is the shell completion of a template's NAME:TAG (each
// described by its status, and public ones as such), ready ones only when
// ready is set (a sandbox starts from those). Any failure completes
// nothing, quietly, as sandboxIDs does.
func (c *apiClient) templateRefs(ready bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if applyEnv(cmd.Flags(), os.LookupEnv) != nil || c.key == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		ts, err := c.listTemplates(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		seen := map[string]bool{}
		for _, t := range ts {
			ref := t.Name + ":" + t.Tag
			// The account's own comes first and is the one the name
			// resolves to: a public one of the same name is hidden.
			shadowed := seen[ref]
			seen[ref] = true
			if shadowed || ready && t.Status != client.TemplateStatusReady || !strings.HasPrefix(ref, toComplete) || slices.Contains(args, ref) {
				continue
			}
			desc := string(t.Status)
			if t.Public {
				desc += ", public"
			}
			out = append(out, cobra.CompletionWithDesc(ref, desc))
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// readInput reads the file name, or stdin for "-", at most 1 MiB.
func readInput(cmd *cobra.Command, name string) ([]byte, error) {
	var r io.Reader = cmd.InOrStdin()
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("larger than 1 MiB")
	}
	return b, nil
}
