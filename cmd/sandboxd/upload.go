package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// uploadCommand is `sandboxd sandbox upload FILE...`: files from this
// machine committed to the account's repository (the files its sandboxes
// start with) in one commit, through POST /api/sandboxes/files as
// multipart/form-data, with the bytes sent shown as they go.
func uploadCommand(g *globals, c *apiClient, asJSON *bool) *cobra.Command {
	var dir, message string
	cmd := &cobra.Command{
		Use:   "upload FILE... [--path DIR] [--message MSG]",
		Short: "Commit files from this machine to the account's repository, which its sandboxes start with",
		Long: "Commit files from this machine to the account's repository in one commit: each under its\n" +
			"base name in --path (default the repository's root). The key's own account only; up to 100\n" +
			"files and 1 GiB at once, each within the server's per-file limit. On a terminal a bar shows\n" +
			"the bytes sent, the rate and the time left; elsewhere (and with --json) log lines do.",
		Example: "  sandboxd sandbox upload data.csv notes.md --path inputs\n" +
			"  sandboxd sandbox upload report.pdf --message 'Add the report' --json",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f := cmd.Flag("account"); f != nil && f.Changed {
				return errors.New("upload acts for the key's own account: --account is not accepted")
			}
			tracker, _ := g.progress(cmd.ErrOrStderr(), *asJSON)
			out, err := c.upload(cmd.Context(), args, dir, message, tracker)
			if err != nil {
				return err
			}
			if *asJSON {
				if err := printJSON(cmd.OutOrStdout(), out); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PATH\tSHA")
				for _, f := range out.Uploaded {
					fmt.Fprintf(tw, "%s\t%s\n", f.Path, f.Sha)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if errs := deref(out.Errors); len(errs) > 0 {
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), "sandboxd: not uploaded:", e)
				}
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "path", "", "directory of the repository to put the files in")
	cmd.Flags().StringVar(&message, "message", "", "commit message (default: the server's)")
	return cmd
}

// upload streams files as one multipart/form-data request (never whole in
// memory), reporting the bytes sent to tracker; once all are sent, the
// server stores and commits them, which the task shows as its last step.
// The generated client sends it: its WithBody variant takes any body of
// any content type, here the reading end of a pipe the form is written
// into as the request goes (the document gives the route's JSON body
// only, and a JSON body would be whole in memory).
func (c *apiClient) upload(ctx context.Context, paths []string, dir, message string, tracker progress.Tracker) (*client.UploadFilesResponse, error) {
	var total int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("upload: %s is not a regular file (name a directory's files, e.g. DIR/*)", p)
		}
		total += fi.Size()
	}
	title := "uploading " + filepath.Base(paths[0])
	if len(paths) > 1 {
		title = fmt.Sprintf("uploading %d files", len(paths))
	}
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	task := tracker.Start(title, progress.Bytes, total)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(writeUploadForm(mw, paths, dir, message, total, task))
	}()
	// The writer stops at its next write once the reader is closed,
	// whether the server answered early (an error) or the request failed.
	defer pr.Close()
	out, err := uploadAnswer(cl.PostSandboxesFilesWithBodyWithResponse(ctx, mw.FormDataContentType(), pr))
	task.Done(err)
	return out, err
}

// uploadAnswer is the answer of an upload: an error answer as the API's
// *client.Error, any other failure (no answer, not JSON) prefixed with
// "upload: ".
func uploadAnswer(res *client.PostSandboxesFilesResult, err error) (*client.UploadFilesResponse, error) {
	res, err = client.Check(res, err)
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		return nil, err
	}
	if err == nil {
		var out *client.UploadFilesResponse
		if out, err = decoded(res.JSON200); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("upload: %w", err)
}

// writeUploadForm writes the form: path and message when given, then each
// file as a "file" part under its base name.
func writeUploadForm(mw *multipart.Writer, paths []string, dir, message string, total int64, task progress.Task) error {
	for _, f := range [][2]string{{"path", dir}, {"message", message}} {
		if f[1] == "" {
			continue
		}
		if err := mw.WriteField(f[0], f[1]); err != nil {
			return err
		}
	}
	cw := &countingWriter{task: task}
	for _, p := range paths {
		cw.name = filepath.Base(p)
		part, err := mw.CreateFormFile("file", cw.name)
		if err != nil {
			return err
		}
		cw.w = part
		if err := copyFile(cw, p); err != nil {
			return err
		}
	}
	if err := mw.Close(); err != nil {
		return err
	}
	task.Update(progress.State{Step: "committing", Current: total})
	return nil
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("upload %s: %w", path, err)
	}
	return nil
}

// countingWriter reports the bytes written through it: the request body
// is a pipe, so a write returns once the HTTP client has taken the bytes.
type countingWriter struct {
	w    io.Writer
	task progress.Task
	name string
	n    int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.task.Update(progress.State{Step: "sending", Detail: c.name, Current: c.n})
	return n, err
}
