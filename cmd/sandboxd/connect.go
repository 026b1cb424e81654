package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sandboxd/sandboxd/internal/api"
)

// defaultShell is what `sandbox connect` runs without a command: a login
// bash where the image has one, else sh.
var defaultShell = []string{"sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi"}

// connectCommand is `sandboxd sandbox connect ID [-- COMMAND...]`: an
// interactive shell (or command) in a running sandbox over the exec
// websocket, on a terminal of the local one's size when stdin is one.
func connectCommand(c *apiClient, account *string) *cobra.Command {
	var cwd string
	var tty bool
	cmd := &cobra.Command{
		Use:   "connect SANDBOX_ID [-- COMMAND [ARGS...]]",
		Short: "Open an interactive shell (or run a command interactively) in a running sandbox",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if len(argv) == 0 {
				argv = defaultShell
			}
			fd := int(os.Stdin.Fd())
			local := term.IsTerminal(fd)
			body := api.ExecRequest{Command: argv[0], Args: argv[1:], Cwd: cwd}
			if local || tty {
				rows, cols := 24, 80
				if w, h, err := term.GetSize(fd); err == nil {
					rows, cols = h, w
				}
				body.PTY = &api.PTYSize{Rows: rows, Cols: cols}
			}
			code, err := c.connect(cmd.Context(), args[0], *account, body, local)
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory")
	cmd.Flags().BoolVar(&tty, "tty", false, "ask for a terminal even when stdin is not one")
	return cmd
}

// connect runs body interactively in sandbox id and returns its exit code.
func (c *apiClient) connect(ctx context.Context, id, account string, body api.ExecRequest, raw bool) (int, error) {
	u, err := url.Parse(strings.TrimRight(c.url, "/") + "/api/sandboxes/" + url.PathEscape(id) + "/exec")
	if err != nil {
		return 0, err
	}
	if account != "" {
		u.RawQuery = url.Values{"account_id": {account}}.Encode()
	}
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: http.Header{"x-api-key": {c.key}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			e := &apiError{Status: resp.StatusCode}
			if resp.Body != nil {
				_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e.Body)
			}
			return 0, e
		}
		return 0, fmt.Errorf("connect to %s: %w", id, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	first, _ := json.Marshal(body)
	if err := conn.Write(ctx, websocket.MessageText, first); err != nil {
		return 0, fmt.Errorf("send the command: %w", err)
	}
	fd := int(os.Stdin.Fd())
	if raw {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return 0, fmt.Errorf("terminal raw mode: %w", err)
		}
		defer term.Restore(fd, old)
		// Window size changes follow the local terminal.
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					b, _ := json.Marshal(map[string]any{"type": "resize", "rows": h, "cols": w})
					_ = conn.Write(ctx, websocket.MessageText, b)
				}
			}
		}()
	}
	go func() { // input: raw bytes; the end of it closes the command's input
		buf := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				_ = conn.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
				return
			}
		}
	}()
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return 0, fmt.Errorf("connection closed before the command ended (%d %s)", ce.Code, ce.Reason)
			}
			return 0, fmt.Errorf("connection: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(msg) == 0 {
				continue
			}
			w := io.Writer(os.Stdout)
			if msg[0] == 2 {
				w = os.Stderr
			}
			_, _ = w.Write(msg[1:])
			continue
		}
		var end struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exitCode"`
			Error    string `json:"error"`
		}
		if json.Unmarshal(msg, &end) != nil {
			continue
		}
		switch end.Type {
		case "exit":
			return end.ExitCode, nil
		case "error":
			return 0, errors.New(end.Error)
		}
	}
}
