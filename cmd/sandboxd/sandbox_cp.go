package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// cpCommand is `sandboxd sandbox cp SRC DEST`: files and directories into
// or out of a running sandbox, as tar archives through GET and PUT
// /api/sandboxes/{id}/files, where they go decided as docker cp decides.
func cpCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DEST",
		Short: "Copy files or directories into or out of a running sandbox (SANDBOX_ID:PATH is a path in one)",
		Long: "Copy a file or a directory (with everything below it) between this machine and a running sandbox; one of\n" +
			"SRC and DEST is SANDBOX_ID:PATH, PATH absolute or relative to /workspace. When DEST is an existing\n" +
			"directory, or ends with /, SRC goes into it under its own name; otherwise DEST is the copy's name.\n" +
			"Permission bits and modification times are kept; links are copied out as links and skipped, with a\n" +
			"warning, on the way in. SRC - reads a tar archive from stdin into the directory DEST; DEST - writes\n" +
			"the archive of SRC to stdout. At most 1 GiB in 100,000 entries at once.",
		Example: "  sandboxd sandbox cp ./src sbx_123:/workspace/src\n" +
			"  sandboxd sandbox cp sbx_123:results/report.csv .\n" +
			"  sandboxd sandbox cp sbx_123:/workspace - | tar -t",
		Args: cobra.ExactArgs(2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if !strings.HasPrefix(toComplete, "sbx") || strings.Contains(toComplete, ":") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return c.completeIDs(cmd, f, true, toComplete, ":"), cobra.ShellCompDirectiveNoSpace
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpArg(args[0]), parseCpArg(args[1])
			std := stdio{cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()}
			switch {
			case src.remote && dst.remote:
				return errors.New("cp copies between this machine and one sandbox: copy out of one, then into the other")
			case !src.remote && !dst.remote:
				return errors.New("one of SRC and DEST must be SANDBOX_ID:PATH")
			case dst.remote:
				return c.copyIn(cmd.Context(), f, src.path, dst, std)
			}
			return c.copyOut(cmd.Context(), f, src, dst.path, std)
		},
	}
}

// cpArg is a SRC or DEST of cp: a local path, or a path in a sandbox.
type cpArg struct {
	id, path string
	remote   bool
}

// parseCpArg reads ID:PATH (an id has no "/", so ./a:b is local) or a
// local path. An empty PATH is the sandbox's /workspace.
func parseCpArg(s string) cpArg {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.ContainsRune(s[:i], '/') {
		return cpArg{path: s}
	}
	p := s[i+1:]
	if p == "" {
		p = "."
	}
	return cpArg{id: s[:i], path: p, remote: true}
}

// copyIn sends src (a local file or directory, or "-": a tar archive on
// stdin) to dst in a sandbox.
func (c *apiClient) copyIn(ctx context.Context, f *clientFlags, src string, dst cpArg, std stdio) error {
	cl, err := c.api()
	if err != nil {
		return err
	}
	dir, body := dst.path, std.in
	if src != "-" {
		if _, err := os.Lstat(src); err != nil {
			return err
		}
		var name string
		dir, name = c.destinationIn(ctx, cl, dst, f.account, filepath.Base(filepath.Clean(src)))
		pr, pw := io.Pipe()
		defer pr.Close()
		go func() { pw.CloseWithError(writeLocalTar(pw, src, name, std.err)) }()
		body = pr
	}
	params := &client.PutSandboxesIDFilesParams{Path: dir, AccountID: optional(f.account)}
	res, err := client.Check(cl.PutSandboxesIDFilesWithBodyWithResponse(ctx, dst.id, params, "application/x-tar", body))
	if err != nil {
		return err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return err
	}
	for _, s := range deref(out.Skipped) {
		fmt.Fprintln(std.err, "sandboxd: not copied:", s)
	}
	if f.asJSON {
		return printJSON(std.out, out)
	}
	fmt.Fprintf(std.err, "sandboxd: copied %s into %s:%s\n", copySummary(out.Files, out.Directories, int64(out.Bytes)), dst.id, dir)
	return nil
}

// destinationIn is where a copy named name goes in the sandbox: into
// dst.path under name when dst.path is a directory or ends with "/",
// else into its parent as its base name.
func (c *apiClient) destinationIn(ctx context.Context, cl *client.ClientWithResponses, dst cpArg, account, name string) (dir, as string) {
	if strings.HasSuffix(dst.path, "/") {
		return dst.path, name
	}
	// A stat that fails (nothing there yet) makes dst.path the name; a
	// sandbox that is not there fails the copy itself, with its answer.
	res, err := client.Check(cl.GetSandboxesIDFilesStatWithResponse(ctx, dst.id, &client.GetSandboxesIDFilesStatParams{Path: dst.path, AccountID: optional(account)}))
	if err == nil && res.JSON200 != nil && res.JSON200.Type == "directory" {
		return res.JSON200.Path, name
	}
	return path.Dir(dst.path), path.Base(dst.path)
}

// copyOut brings src (a path in a sandbox) to dst on this machine ("-":
// the archive itself to stdout).
func (c *apiClient) copyOut(ctx context.Context, f *clientFlags, src cpArg, dst string, std stdio) error {
	cl, err := c.api()
	if err != nil {
		return err
	}
	resp, err := cl.GetSandboxesIDFiles(ctx, src.id, &client.GetSandboxesIDFilesParams{Path: src.path, AccountID: optional(f.account)})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errorAnswer(resp)
	}
	if dst == "-" {
		if _, err := io.Copy(std.out, resp.Body); err != nil {
			return fmt.Errorf("copy out of %s: %w", src.id, err)
		}
		return nil
	}
	into, rename, err := destinationOut(src.path, dst)
	if err != nil {
		return err
	}
	got, err := extractLocalTar(resp.Body, into, rename)
	if err != nil {
		return fmt.Errorf("copy %s:%s to %s: %w", src.id, src.path, dst, err)
	}
	if f.asJSON {
		return printJSON(std.out, got)
	}
	fmt.Fprintf(std.err, "sandboxd: copied %s to %s\n", copySummary(got.Files, got.Directories, got.Bytes), dst)
	return nil
}

// destinationOut is the local directory an archive of src goes into, and
// the name its top entry takes there ("": its own): into dst when it is a
// directory (or ends with a separator: made), else into dst's parent as
// dst's base name. The archive of a sandbox's "/" has no top entry: its
// entries go into dst.
func destinationOut(src, dst string) (into, rename string, err error) {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return dst, "", nil
	}
	if strings.HasSuffix(dst, string(filepath.Separator)) || path.Clean(src) == "/" {
		return dst, "", os.MkdirAll(dst, 0o755)
	}
	parent := filepath.Dir(dst)
	if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
		return "", "", fmt.Errorf("%s: no such directory to copy into", parent)
	}
	return parent, filepath.Base(dst), nil
}

// copySummary says what a copy carried.
func copySummary(files, dirs int, bytes int64) string {
	return fmt.Sprintf("%d files and %d directories (%s)", files, dirs, humanize.IBytes(uint64(max(bytes, 0))))
}
