package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The interactive exec's websocket protocol (GET /api/sandboxes/{id}/exec
// with Upgrade: websocket): the client's first message is a text message
// with the body of POST .../exec; then binary messages are input and text
// messages are controls (wsControl). The server sends binary messages
// whose first byte is the stream (wsStdout, wsStderr) and a last text
// message, wsEnd, then closes. Closing the socket kills the command.
const (
	wsStdout = 1
	wsStderr = 2
	// wsReadLimit bounds one message from the client.
	wsReadLimit = 64 << 10
	// wsFirstMessage is how long the server waits for the command.
	wsFirstMessage = 30 * time.Second
)

// wsControl is a control message from the client: "resize" (rows, cols),
// "signal" (signal, one of wsSignals) or "eof" (close the input).
type wsControl struct {
	Type   string `json:"type"`
	Rows   int    `json:"rows,omitempty"`
	Cols   int    `json:"cols,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// wsEnd is the server's last message: "exit" with the command's end, or
// "error" with what went wrong.
type wsEnd struct {
	Type       string `json:"type"`
	ExitCode   int    `json:"exitCode"`
	OOMKilled  bool   `json:"oomKilled,omitempty"`
	DurationMs int64  `json:"durationMs,omitempty"`
	Error      string `json:"error,omitempty"`
}

// wsSignals are the signals a client may send.
var wsSignals = map[string]syscall.Signal{
	"SIGINT": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL,
	"SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT,
}

// execInteractive serves the websocket form of exec. Who may act on the
// sandbox is settled before the upgrade, so refusals keep the statuses
// of POST .../exec.
func (s *Server) execInteractive(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxOfQuery(r)
	if err != nil {
		return err
	}
	if sb.Status != store.SandboxRunning {
		return serviceError(errdefs.ErrNotRunning, "Sandbox not found")
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return nil // Accept answered the request
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wsReadLimit)
	end := s.runInteractive(r.Context(), conn, sb)
	b, _ := json.Marshal(end)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	_ = conn.Write(wctx, websocket.MessageText, b)
	_ = conn.Close(websocket.StatusNormalClosure, "")
	return nil
}

func (s *Server) runInteractive(ctx context.Context, conn *websocket.Conn, sb store.Sandbox) wsEnd {
	fctx, cancel := context.WithTimeout(ctx, wsFirstMessage)
	typ, first, err := conn.Read(fctx)
	cancel()
	if err != nil {
		return wsEnd{Type: "error", Error: "expected the command as the first message"}
	}
	if typ != websocket.MessageText {
		return wsEnd{Type: "error", Error: "the first message must be the command's JSON, as text"}
	}
	o, err := decodeObject(first)
	var req ExecRequest
	if err == nil {
		req, err = parseExec(o)
	}
	if err != nil {
		return wsEnd{Type: "error", Error: errorText(err)}
	}
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	inR, inW := io.Pipe()
	defer inR.Close()
	resize := make(chan runtime.WindowSize, 8)
	signals := make(chan syscall.Signal, 8)
	input := make(chan []byte, 64)
	go func() { // input in order, apart from the controls
		defer inW.Close()
		for b := range input {
			if _, err := inW.Write(b); err != nil {
				return
			}
		}
	}()
	go func() { // the client: input and controls; gone kills the command
		defer stop()
		closed := false
		defer func() {
			if !closed {
				close(input)
			}
		}()
		for {
			typ, b, err := conn.Read(ectx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if closed {
					continue
				}
				select {
				case input <- b:
				case <-ectx.Done():
					return
				}
				continue
			}
			var c wsControl
			if json.Unmarshal(b, &c) != nil {
				continue
			}
			switch c.Type {
			case "resize":
				if c.Rows >= 1 && c.Rows <= 1000 && c.Cols >= 1 && c.Cols <= 1000 {
					select {
					case resize <- runtime.WindowSize{Rows: uint16(c.Rows), Cols: uint16(c.Cols)}:
					default: // a newer size follows
					}
				}
			case "signal":
				if sig, ok := wsSignals[c.Signal]; ok {
					select {
					case signals <- sig:
					default:
					}
				}
			case "eof":
				if !closed {
					closed = true
					close(input)
				}
			}
		}
	}()
	dreq := req.Domain()
	dreq.Stdin, dreq.Input, dreq.Resize, dreq.Signal = "", inR, resize, signals
	start := time.Now()
	res, err := s.opts.Sandboxes.Exec(ectx, sb, dreq, wsStream{ctx: ectx, conn: conn, id: wsStdout}, wsStream{ctx: ectx, conn: conn, id: wsStderr})
	if err != nil {
		if ctx.Err() != nil {
			return wsEnd{Type: "error", Error: "the connection ended"}
		}
		var e *Error
		msg := "Internal server error"
		if errors.As(serviceError(err, "Sandbox not found"), &e) {
			msg = e.Msg
		} else {
			s.log.ErrorContext(ctx, "interactive exec", "err", err, "sandbox_id", sb.ID, "request_id", requestID(ctx))
		}
		return wsEnd{Type: "error", Error: msg}
	}
	return wsEnd{Type: "exit", ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, DurationMs: time.Since(start).Milliseconds()}
}

// errorText is the message of a validation error.
func errorText(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return "Invalid request"
}

// wsStream sends each write as a binary message tagged with its stream.
type wsStream struct {
	ctx  context.Context
	conn *websocket.Conn
	id   byte
}

func (s wsStream) Write(p []byte) (int, error) {
	msg := make([]byte, 1+len(p))
	msg[0] = s.id
	copy(msg[1:], p)
	if err := s.conn.Write(s.ctx, websocket.MessageBinary, msg); err != nil {
		return 0, err
	}
	return len(p), nil
}
