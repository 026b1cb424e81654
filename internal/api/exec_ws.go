package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
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
// messages are controls (ExecControl). The server sends binary messages
// whose first byte is the stream (wsStdout, wsStderr) and a last text
// message, ExecEnd, then closes. Closing the socket kills the command;
// so does a message that breaks the protocol, after an ExecEnd saying
// what was wrong.
const (
	wsStdout = 1
	wsStderr = 2
	// wsReadLimit bounds one message from the client; a longer one
	// closes the socket (1009, message too big).
	wsReadLimit = 64 << 10
	// wsInputQueue is how many input messages wait for a command that
	// does not read them (at most 1 MiB); then the client's messages wait.
	wsInputQueue = 16
	// wsFirstMessage is how long the server waits for the command.
	wsFirstMessage = 30 * time.Second
	// wsLastWrite bounds the sending of the ExecEnd.
	wsLastWrite = 5 * time.Second
)

// ExecControl is a control message of the client: "resize" (Rows, Cols,
// 1..1000 each), "signal" (Signal: SIGINT, SIGTERM, SIGKILL, SIGHUP or
// SIGQUIT, for the command and what it started) or "eof" (closes the
// command's input).
type ExecControl struct {
	Type   string `json:"type"`
	Rows   int    `json:"rows,omitempty"`
	Cols   int    `json:"cols,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// ExecEnd is the server's last message: Type "exit" with how the command
// ended, or "error" with what went wrong (and, for a refused command, the
// field, as missing_fields in the API's error bodies).
type ExecEnd struct {
	Type          string `json:"type"`
	ExitCode      int    `json:"exitCode"`
	OOMKilled     bool   `json:"oomKilled"`
	TimedOut      bool   `json:"timedOut,omitempty"`
	DurationMs    int64  `json:"durationMs"`
	Error         string `json:"error"`
	MissingFields []any  `json:"missing_fields,omitempty"`
}

// MarshalJSON sends an exit without the error fields and an error with
// only them.
func (e ExecEnd) MarshalJSON() ([]byte, error) {
	if e.Type == "error" {
		return json.Marshal(struct {
			Type          string `json:"type"`
			Error         string `json:"error"`
			MissingFields []any  `json:"missing_fields,omitempty"`
		}{e.Type, e.Error, e.MissingFields})
	}
	return json.Marshal(struct {
		Type       string `json:"type"`
		ExitCode   int    `json:"exitCode"`
		OOMKilled  bool   `json:"oomKilled"`
		TimedOut   bool   `json:"timedOut,omitempty"`
		DurationMs int64  `json:"durationMs"`
	}{e.Type, e.ExitCode, e.OOMKilled, e.TimedOut, e.DurationMs})
}

// execInteractive serves the websocket form of exec. Who may act on the
// sandbox is settled before the upgrade, so refusals keep the statuses
// of POST .../exec.
func (s *Server) execInteractive(w http.ResponseWriter, r *http.Request) error {
	if !isWebsocketUpgrade(r) {
		w.Header().Set("Upgrade", "websocket")
		return &Error{Status: http.StatusUpgradeRequired, Msg: "GET /api/sandboxes/{id}/exec is a websocket (Upgrade: websocket); POST /api/sandboxes/{id}/exec runs a command without one"}
	}
	sb, err := s.sandboxOfQuery(r)
	if err != nil {
		return err
	}
	if sb.Status != store.SandboxRunning {
		return serviceError(errdefs.ErrNotRunning, "Sandbox not found")
	}
	opts := &websocket.AcceptOptions{
		// No credential is ambient (the key is a header or a subprotocol,
		// never a cookie), so a page of another origin can do nothing
		// here that it could not do without a browser: any origin, as
		// CORS allows.
		InsecureSkipVerify: true,
	}
	if proto, n := keyProtocol(r); n == 1 {
		// The key came as the subprotocol (requestKey); a browser fails
		// a handshake that does not select one of those it offered.
		opts.Subprotocols = []string{proto}
	}
	conn, err := websocket.Accept(w, r, opts)
	if err != nil {
		return nil // Accept answered the request
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wsReadLimit)
	end := s.interact(r, conn, sb)
	b, err := json.Marshal(end)
	if err != nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), wsLastWrite)
	defer cancel()
	if conn.Write(wctx, websocket.MessageText, b) == nil {
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
	return nil
}

// interact runs the command of the client's first message with the
// client's input and controls, and says how it ended.
func (s *Server) interact(r *http.Request, conn *websocket.Conn, sb store.Sandbox) ExecEnd {
	// conn's reads use the connection's context: one cancelled while a
	// read waits closes the socket, and the ExecEnd must still go out
	// after the command ends.
	ctx := r.Context()
	req, err := s.readCommand(r, conn, sb)
	if err != nil {
		return errorEnd(err)
	}
	ectx, stop := context.WithCancel(ctx) // the command's
	defer stop()
	// The output's writes have a context of their own: one cancelled while
	// a write is under way closes the socket, so it ends only when the
	// client is gone or does not read.
	octx, stopOutput := context.WithCancel(ctx)
	defer stopOutput()
	inR, inW := io.Pipe()
	defer inR.Close()
	input := make(chan []byte, wsInputQueue)
	go func() { // input in order, apart from the controls
		defer inW.Close()
		for b := range input {
			if _, err := inW.Write(b); err != nil {
				return
			}
		}
	}()
	resize := make(chan runtime.WindowSize, 1)
	signals := make(chan syscall.Signal, 4)
	broken := make(chan error, 1)
	go func() { // the client; when it goes or breaks the protocol, the command ends
		err := readClient(ctx, ectx, conn, input, resize, signals)
		switch {
		case errors.Is(err, errCommandEnded):
		case err != nil:
			broken <- err
			stop()
			// The ExecEnd saying what was wrong follows the command's
			// last output, unless the client does not read.
			time.AfterFunc(wsLastWrite, stopOutput)
		default:
			stopOutput()
			stop()
		}
	}()
	dreq := req.Domain()
	dreq.Input = inR
	if dreq.Stdin != "" {
		dreq.Input = io.MultiReader(strings.NewReader(dreq.Stdin), inR)
	}
	dreq.Stdin, dreq.Resize, dreq.Signal = "", resize, signals
	start := time.Now()
	res, err := s.opts.Sandboxes.Exec(ectx, principal(r), sb.ID, dreq, wsStream{ctx: octx, conn: conn, id: wsStdout}, wsStream{ctx: octx, conn: conn, id: wsStderr})
	select {
	case perr := <-broken:
		return errorEnd(perr)
	default:
	}
	if err != nil {
		if ectx.Err() != nil {
			return ExecEnd{Type: "error", Error: "the connection ended"} // nobody reads it
		}
		var e *Error
		if errors.As(serviceError(err, "Sandbox not found"), &e) {
			return errorEnd(e)
		}
		s.log.ErrorContext(ctx, "interactive exec", "err", err, "sandbox_id", sb.ID, "request_id", requestID(ctx))
		return ExecEnd{Type: "error", Error: "Internal server error"}
	}
	return ExecEnd{Type: "exit", ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut, DurationMs: time.Since(start).Milliseconds()}
}

// readCommand reads and validates the first message: the body of POST
// .../exec, whose account_id, when given, must be the sandbox's as the
// query's is.
func (s *Server) readCommand(r *http.Request, conn *websocket.Conn, sb store.Sandbox) (ExecRequest, error) {
	ctx, cancel := context.WithTimeout(r.Context(), wsFirstMessage)
	defer cancel()
	typ, first, err := conn.Read(ctx)
	if err != nil {
		return ExecRequest{}, errBadRequest("Expected the command as the first message")
	}
	if typ != websocket.MessageText {
		return ExecRequest{}, errBadRequest("The first message must be text: the JSON body of POST /api/sandboxes/{id}/exec")
	}
	o, err := decodeObject(first)
	if err != nil {
		return ExecRequest{}, err
	}
	req, err := parseExec(o)
	if err != nil {
		return req, err
	}
	// An interactive session ends with its websocket, its command too:
	// nobody could type into one left running.
	if o.present("killOnDisconnect") && !req.KillOnDisconnect {
		return req, errField("killOnDisconnect cannot be false on the websocket: an interactive command ends when its socket closes", "killOnDisconnect")
	}
	req.KillOnDisconnect = true
	if req.AccountID != "" {
		account, err := s.actFor(r, req.AccountID)
		if err != nil {
			return req, err
		}
		if account != sb.AccountID {
			return req, errNotFound("Sandbox not found")
		}
	}
	return req, nil
}

// errCommandEnded ends readClient when the command ended first.
var errCommandEnded = errors.New("the command ended")

// readClient reads the client's messages after the command until the
// client goes (nil), the command ends while a message waits for it
// (errCommandEnded) or the client breaks the protocol (the *Error saying
// how): input
// goes to input in order (closed at "eof" and at the end), sizes to resize
// (the latest only), signals to signals. It reads with ctx, the
// connection's; ectx is the command's.
func readClient(ctx, ectx context.Context, conn *websocket.Conn, input chan<- []byte, resize chan runtime.WindowSize, signals chan<- syscall.Signal) error {
	open := true
	defer func() {
		if open {
			close(input)
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return nil
		}
		if typ == websocket.MessageBinary {
			if !open {
				return errBadRequest("Input after eof")
			}
			select {
			case input <- b:
			case <-ectx.Done():
				return errCommandEnded
			}
			continue
		}
		c, sig, err := parseControl(b)
		if err != nil {
			return err
		}
		switch c.Type {
		case "resize":
			size := runtime.WindowSize{Rows: uint16(c.Rows), Cols: uint16(c.Cols)}
			select { // a size not yet taken is stale
			case <-resize:
			default:
			}
			select {
			case resize <- size:
			default:
			}
		case "signal":
			select {
			case signals <- sig:
			case <-ectx.Done():
				return errCommandEnded
			}
		case "eof":
			if open {
				open = false
				close(input)
			}
		}
	}
}

// parseControl validates a control message.
func parseControl(b []byte) (ExecControl, syscall.Signal, error) {
	var c ExecControl
	o, err := decodeObject(b)
	if err != nil {
		return c, 0, errBadRequest(`A text message after the command must be a control: a JSON object with "type" resize, signal or eof`)
	}
	if c.Type, _, err = o.str("type"); err != nil {
		return c, 0, err
	}
	switch c.Type {
	case "resize":
		size, err := termSize(o, "")
		if err != nil {
			return c, 0, err
		}
		c.Rows, c.Cols = size.Rows, size.Cols
		return c, 0, nil
	case "signal":
		if c.Signal, _, err = o.str("signal"); err != nil {
			return c, 0, err
		}
		sig, ok := killSignals[c.Signal]
		if !ok {
			return c, 0, errField("signal must be one of SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT", "signal")
		}
		return c, sig, nil
	case "eof":
		return c, 0, nil
	}
	return c, 0, errField("type must be one of resize, signal, eof", "type")
}

// errorEnd is the ExecEnd of a refusal.
func errorEnd(err error) ExecEnd {
	var e *Error
	if errors.As(err, &e) {
		return ExecEnd{Type: "error", Error: e.Msg, MissingFields: e.Fields}
	}
	return ExecEnd{Type: "error", Error: "Internal server error"}
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
