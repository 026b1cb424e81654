package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
)

// maxCodeLine bounds one line of an execution's stream (a result's image
// is at most 10 MiB in the sandbox, base64 and JSON around it).
const maxCodeLine = 24 << 20

// codeCommand is `sandboxd sandbox code ID -- CODE`: code run in a
// stateful context of a sandbox's code interpreter.
func codeCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var (
		language, contextID, file, saveDir string
		envs                               []string
		timeout                            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "code SANDBOX_ID [flags] [-- CODE...]",
		Short: "Run code in a sandbox's code interpreter (a Jupyter kernel that keeps its state), streaming its output",
		Long: "Run code in a stateful context of the sandbox's code interpreter: the default context of --language\n" +
			"(python unless given; made on first use), or --context. The code is the arguments after --, joined\n" +
			"by spaces, or --file (- for stdin). stdout and stderr stream as the code prints; each result is\n" +
			"printed as text (images as a line naming them; --save DIR writes them there); an exception's\n" +
			"traceback goes to stderr and the exit status is 1. --timeout interrupts the cell (the context keeps\n" +
			"its state). The sandbox needs Jupyter kernels: the code-interpreter template has them.",
		Example: "  sandboxd sandbox code sbx_123 -- 'x = 6 * 7; x'\n" +
			"  sandboxd sandbox code sbx_123 --file analysis.py --save charts/\n" +
			"  sandboxd sandbox code sbx_123 --language r -- 'summary(c(1, 2, 3))'\n" +
			"  echo 'import sys; sys.version' | sandboxd sandbox code sbx_123 --file - --json",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := codeSource(cmd.InOrStdin(), file, args[1:])
			if err != nil {
				return err
			}
			if language != "" && contextID != "" {
				return errors.New("--language and --context: give one")
			}
			body := client.CodeRequest{Code: code, AccountID: optional(f.account), Language: optional(language), ContextID: optional(contextID)}
			if len(envs) > 0 {
				m := map[string]string{}
				for _, kv := range envs {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("--env %q: want NAME=value", kv)
					}
					m[k] = v
				}
				body.Envs = &m
			}
			if timeout > 0 {
				body.Timeout = optional(int(max(1, timeout.Milliseconds())))
			}
			cl, err := c.api()
			if err != nil {
				return err
			}
			if f.asJSON {
				res, err := client.Check(cl.PostSandboxesIDCodeWithResponse(cmd.Context(), args[0], body))
				if err != nil {
					return err
				}
				out, err := decoded(res.JSON200)
				if err != nil {
					return err
				}
				if err := printJSONSorted(cmd.OutOrStdout(), out); err != nil {
					return err
				}
				if out.Error != nil {
					return &exitError{code: 1}
				}
				return nil
			}
			return streamCode(cmd.Context(), cl, args[0], body, codePrinter{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr(), save: saveDir})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&language, "language", "", "run in the default context of this language (python, r, ...: the sandbox's kernels)")
	fl.StringVar(&contextID, "context", "", "run in this context (sandboxd sandbox code-context create)")
	fl.StringVar(&file, "file", "", "read the code from this file (- for stdin)")
	fl.StringArrayVar(&envs, "env", nil, "NAME=value for this execution only (repeatable)")
	fl.DurationVar(&timeout, "timeout", 0, "interrupt the cell after this long")
	fl.StringVar(&saveDir, "save", "", "write the results' images (png, jpeg, svg, pdf) to this directory")
	return cmd
}

// codeSource is the code to run: --file's, or the arguments'.
func codeSource(stdin io.Reader, file string, args []string) (string, error) {
	switch {
	case file != "" && len(args) > 0:
		return "", errors.New("--file and code after --: give one")
	case file == "-":
		b, err := io.ReadAll(io.LimitReader(stdin, 8<<20))
		return string(b), err
	case file != "":
		b, err := os.ReadFile(file)
		return string(b), err
	case len(args) == 0:
		return "", errors.New("no code: give it after -- or with --file")
	}
	return strings.Join(args, " "), nil
}

// streamCode runs body with E2B's line stream and prints each line as it
// comes.
func streamCode(ctx context.Context, cl *client.ClientWithResponses, id string, body client.CodeRequest, p codePrinter) error {
	resp, err := cl.PostSandboxesIDCode(ctx, id, body, func(_ context.Context, req *http.Request) error {
		req.Header.Set("Accept", "application/x-ndjson")
		return nil
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errorAnswer(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCodeLine)
	failed := false
	for sc.Scan() {
		var l codeint.Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("decode the stream: %w", err)
		}
		switch l.Type {
		case codeint.LineStdout:
			io.WriteString(p.out, deref(l.Text))
		case codeint.LineStderr:
			io.WriteString(p.err, deref(l.Text))
		case codeint.LineResult:
			var r codeint.Result
			_ = json.Unmarshal(sc.Bytes(), &r)
			if err := p.result(r); err != nil {
				return err
			}
		case codeint.LineError:
			failed = true
			tb := deref(l.Traceback)
			if tb == "" {
				tb = deref(l.Name) + ": " + deref(l.Value)
			}
			fmt.Fprintln(p.err, tb)
		case codeint.LineEnd:
			if failed {
				return &exitError{code: 1}
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the stream: %w", err)
	}
	return errors.New("the stream ended before the execution did")
}

// codePrinter prints an execution's results.
type codePrinter struct {
	out, err io.Writer
	save     string
	n        int
}

// result prints r's text (or says what it is), and saves its images.
func (p *codePrinter) result(r codeint.Result) error {
	p.n++
	images := []struct {
		ext  string
		data json.RawMessage
		b64  bool
	}{{"png", r.PNG, true}, {"jpeg", r.JPEG, true}, {"pdf", r.PDF, true}, {"svg", r.SVG, false}}
	var kinds []string
	for _, im := range images {
		if len(im.data) == 0 {
			continue
		}
		kinds = append(kinds, im.ext)
		if p.save == "" {
			continue
		}
		var s string
		if err := json.Unmarshal(im.data, &s); err != nil {
			return fmt.Errorf("result %d's %s: %w", p.n, im.ext, err)
		}
		b := []byte(s)
		if im.b64 {
			var err error
			if b, err = base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err != nil {
				return fmt.Errorf("result %d's %s: %w", p.n, im.ext, err)
			}
		}
		if err := os.MkdirAll(p.save, 0o755); err != nil {
			return err
		}
		name := filepath.Join(p.save, fmt.Sprintf("result-%d.%s", p.n, im.ext))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(p.err, "sandboxd: saved %s\n", name)
	}
	switch {
	case len(kinds) > 0 && p.save == "":
		fmt.Fprintf(p.out, "[%s image; --save DIR writes it]\n", strings.Join(kinds, ", "))
	case r.Text != nil && len(kinds) == 0:
		fmt.Fprintln(p.out, *r.Text)
	}
	return nil
}

// codeContextCommands are `sandboxd sandbox code-context ls|create|restart|rm`.
func codeContextCommands(c *apiClient, f *clientFlags) *cobra.Command {
	group := &cobra.Command{Use: "code-context", Short: "List, create, restart and remove a sandbox's code contexts (kernels)"}
	ls := &cobra.Command{
		Use: "ls SANDBOX_ID", Short: "List a sandbox's code contexts", Args: cobra.ExactArgs(1),
		Example:           "  sandboxd sandbox code-context ls sbx_123 --json",
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.GetSandboxesIDCodeContextsWithResponse(cmd.Context(), args[0], &client.GetSandboxesIDCodeContextsParams{AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSONSorted(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD")
			for _, cx := range out.Contexts {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", cx.ID, cx.Language, cx.Cwd)
			}
			return tw.Flush()
		},
	}
	var language, cwd string
	create := &cobra.Command{
		Use: "create SANDBOX_ID", Short: "Start a code context: a new kernel (prints its id)", Args: cobra.ExactArgs(1),
		Example:           "  sandboxd sandbox code-context create sbx_123 --language r --cwd /tmp",
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PostSandboxesIDCodeContextsWithResponse(cmd.Context(), args[0],
				client.CodeContextRequest{Language: optional(language), Cwd: optional(cwd), AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSONSorted(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.Context.ID)
			return err
		},
	}
	create.Flags().StringVar(&language, "language", "", "the kernel's language (default python)")
	create.Flags().StringVar(&cwd, "cwd", "", "its working directory (an absolute path)")
	contextOp := func(use, done, short, example string, call func(ctx context.Context, cl *client.ClientWithResponses, id, cx string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " SANDBOX_ID CONTEXT_ID", Short: short, Args: cobra.ExactArgs(2), Example: example,
			ValidArgsFunction: c.sandboxIDs(f, true),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, err := c.api()
				if err != nil {
					return err
				}
				if err := call(cmd.Context(), cl, args[0], args[1]); err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(cmd.OutOrStdout(), client.StatusResponse{Status: client.StatusResponseStatusSuccess})
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: context %s\n", done, args[1])
				return err
			},
		}
	}
	restart := contextOp("restart", "restarted", "Restart a code context's kernel: same id, no state",
		"  sandboxd sandbox code-context restart sbx_123 4f0c2d9e-...",
		func(ctx context.Context, cl *client.ClientWithResponses, id, cx string) error {
			_, err := client.Check(cl.PostSandboxesIDCodeContextsContextIDRestartWithResponse(ctx, id, cx, &client.PostSandboxesIDCodeContextsContextIDRestartParams{AccountID: optional(f.account)}))
			return err
		})
	rm := contextOp("rm", "removed", "Stop a code context's kernel and forget it",
		"  sandboxd sandbox code-context rm sbx_123 4f0c2d9e-...",
		func(ctx context.Context, cl *client.ClientWithResponses, id, cx string) error {
			_, err := client.Check(cl.DeleteSandboxesIDCodeContextsContextIDWithResponse(ctx, id, cx, &client.DeleteSandboxesIDCodeContextsContextIDParams{AccountID: optional(f.account)}))
			return err
		})
	group.AddCommand(ls, create, restart, rm)
	return group
}
