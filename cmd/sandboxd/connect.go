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

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/api"
)

// defaultShell is what `sandbox connect` runs without a command: a login
// bash where the image has one, else a login sh.
var defaultShell = []string{"sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}

// connectGiveUp is how many signals `sandbox connect` passes on to the
// remote command before it gives up and closes the connection, which
// kills the command.
const connectGiveUp = 3

// connectCommand is `sandboxd sandbox connect ID [--shell SHELL] [--
// COMMAND...]`: an interactive shell (or command) in a running sandbox
// over the exec websocket, on a terminal of the local one's size when
// stdin is one.
func connectCommand(c *apiClient, f *clientFlags) *cobra.Command {
	account := &f.account
	var cwd, shell string
	var tty bool
	cmd := &cobra.Command{
		Use:   "connect SANDBOX_ID [--shell SHELL] [-- COMMAND [ARGS...]]",
		Short: "Open an interactive shell (or run a command interactively) in a running sandbox",
		Long: "Open an interactive shell in a running sandbox: a login bash where the sandbox has one, else sh, or --shell,\n" +
			"or COMMAND. When stdin is a terminal it is put in raw mode and the command runs on a terminal of its size\n" +
			"that follows its resizes; otherwise (or with --tty) input and output are passed through as they are.\n" +
			"SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the command; the third one closes the connection,\n" +
			"which kills it. The exit status is the command's.",
		Example: "  sandboxd sandbox connect sbx_123\n" +
			"  sandboxd sandbox connect sbx_123 --shell zsh\n" +
			"  sandboxd sandbox connect sbx_123 -- python3",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			switch {
			case len(argv) > 0 && shell != "":
				return errors.New("give --shell or a command, not both")
			case shell != "":
				argv = []string{shell, "-l"}
			case len(argv) == 0:
				argv = defaultShell
			}
			fd := int(os.Stdin.Fd())
			local := term.IsTerminal(fd)
			body := api.ExecRequest{Command: argv[0], Args: argv[1:], Cwd: cwd}
			if local || tty {
				rows, cols := 24, 80
				if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
					rows, cols = h, w
				}
				body.PTY = &api.PTYSize{Rows: min(rows, 1000), Cols: min(cols, 1000)}
				if t := os.Getenv("TERM"); t != "" {
					body.Env = map[string]string{"TERM": t}
				}
			}
			end, err := c.connect(cmd.Context(), args[0], *account, body, local, stdio{os.Stdin, os.Stdout, os.Stderr})
			if err != nil {
				return err
			}
			if end.ExitCode != 0 {
				return &exitError{code: end.ExitCode}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory")
	cmd.Flags().StringVar(&shell, "shell", "", "the shell to run (as a login shell, SHELL -l) instead of bash or sh")
	cmd.Flags().BoolVar(&tty, "tty", false, "ask for a terminal even when stdin is not one")
	return cmd
}

// stdio are the streams of a command run over the exec websocket.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// connect runs body interactively in sandbox id with the streams std
// and returns how it ended (an "exit" ExecEnd); raw puts the local
// terminal (os.Stdin) in raw mode meanwhile and follows its size.
func (c *apiClient) connect(ctx context.Context, id, account string, body api.ExecRequest, raw bool, std stdio) (api.ExecEnd, error) {
	u, err := url.Parse(strings.TrimRight(c.url, "/") + "/api/sandboxes/" + url.PathEscape(id) + "/exec")
	if err != nil {
		return api.ExecEnd{}, err
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
			e := &client.Error{StatusCode: resp.StatusCode}
			if resp.Body != nil {
				_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e.Body)
			}
			return api.ExecEnd{}, e
		}
		return api.ExecEnd{}, fmt.Errorf("connect to %s: %w", id, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	first, err := json.Marshal(body)
	if err != nil {
		return api.ExecEnd{}, err
	}
	if err := conn.Write(ctx, websocket.MessageText, first); err != nil {
		return api.ExecEnd{}, fmt.Errorf("send the command: %w", err)
	}
	// From here the signals that end this process (main's context) go to
	// the remote command instead.
	ctx = context.WithoutCancel(ctx)
	control := func(c api.ExecControl) {
		b, _ := json.Marshal(c)
		_ = conn.Write(ctx, websocket.MessageText, b)
	}
	fd := int(os.Stdin.Fd())
	if raw {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return api.ExecEnd{}, fmt.Errorf("terminal raw mode: %w", err)
		}
		defer func() { _ = term.Restore(fd, old) }()
		// The remote terminal follows the local one's size.
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
					control(api.ExecControl{Type: "resize", Rows: min(h, 1000), Cols: min(w, 1000)})
				}
			}
		}()
	}
	sigs := make(chan os.Signal, connectGiveUp)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	gaveUp := make(chan struct{})
	go func() {
		for n := 1; ; n++ {
			sig := (<-sigs).(syscall.Signal)
			if n == connectGiveUp {
				close(gaveUp)
				conn.CloseNow()
				return
			}
			control(api.ExecControl{Type: "signal", Signal: signalName(sig)})
		}
	}()
	go func() { // input as it comes; its end closes the command's input
		buf := make([]byte, 32<<10)
		for {
			n, err := std.in.Read(buf)
			if n > 0 {
				if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				control(api.ExecControl{Type: "eof"})
				return
			}
		}
	}()
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			select {
			case <-gaveUp:
				return api.ExecEnd{}, fmt.Errorf("closed the connection after %d signals, which killed the command", connectGiveUp)
			default:
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return api.ExecEnd{}, fmt.Errorf("connection closed before the command ended (%d %s)", ce.Code, ce.Reason)
			}
			return api.ExecEnd{}, fmt.Errorf("connection: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(msg) == 0 {
				continue
			}
			w := std.out
			if msg[0] == 2 {
				w = std.err
			}
			_, _ = w.Write(msg[1:])
			continue
		}
		var end api.ExecEnd
		if json.Unmarshal(msg, &end) != nil {
			continue
		}
		switch end.Type {
		case "exit":
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return end, nil
		case "error":
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return api.ExecEnd{}, errors.New(end.Error)
		}
	}
}

// signalName is a signal as the exec websocket names it.
func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return "SIGKILL"
}
