package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

func TestParseExecPTY(t *testing.T) {
	cases := []struct {
		body   string
		want   *PTYSize
		err    string
		fields string
	}{
		{body: `{"command":"sh","pty":{"rows":40,"cols":120}}`, want: &PTYSize{Rows: 40, Cols: 120}},
		{body: `{"command":"sh","pty":{"rows":1,"cols":1000}}`, want: &PTYSize{Rows: 1, Cols: 1000}},
		{body: `{"command":"sh"}`},
		{body: `{"command":"sh","pty":null}`},
		{body: `{"command":"sh","pty":{"rows":0,"cols":80}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24,"cols":1001}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{"rows":-5,"cols":80}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24}}`, err: "pty.cols must be between 1 and 1000", fields: "[pty cols]"},
		{body: `{"command":"sh","pty":{}}`, err: "pty.rows must be between 1 and 1000", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":"24","cols":80}}`, err: "pty.rows must be an integer", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":{"rows":24.5,"cols":80}}`, err: "pty.rows must be an integer", fields: "[pty rows]"},
		{body: `{"command":"sh","pty":true}`, err: "Expected object, received boolean", fields: "[pty]"},
		{body: `{"command":"sh","pty":[24,80]}`, err: "Expected object, received array", fields: "[pty]"},
	}
	for _, tc := range cases {
		o, err := decodeObject([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req, err := parseExec(o)
		if tc.fields == "" {
			if err != nil || fmt.Sprint(req.PTY) != fmt.Sprint(tc.want) {
				t.Errorf("%s: pty %v, %v; want %v", tc.body, req.PTY, err, tc.want)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || fmt.Sprint(e.Fields) != tc.fields || e.Msg != tc.err {
			t.Errorf("%s: %+v, want 400 %q on %s", tc.body, err, tc.err, tc.fields)
		}
	}
}

// TestExecStreamError: the error event of a streamed exec carries the
// status the non-streamed exec answers the same error with.
func TestExecStreamError(t *testing.T) {
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprint(stdout, "partial")
		if req.Command == "nope" {
			return sandbox.ExecResult{}, errdefs.New(errdefs.ErrInvalid, "command not found: nope")
		}
		return sandbox.ExecResult{}, errors.New("the runtime broke")
	})
	for _, tc := range []struct {
		command, event string
		status         int
	}{
		{"nope", `event: error` + "\n" + `data: {"error":"command not found: nope","statusCode":400}`, 400},
		{"broken", `event: error` + "\n" + `data: {"error":"Internal server error","statusCode":500}`, 500},
	} {
		req := httptest.NewRequest("POST", "/api/sandboxes/"+f.sandbox+"/exec", strings.NewReader(`{"command":"`+tc.command+`"}`))
		req.Header.Set("x-api-key", f.key)
		req.Header.Set("Accept", "text/event-stream")
		rec := httptest.NewRecorder()
		f.srv.ServeHTTP(rec, req)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), tc.event) {
			t.Errorf("%s streamed: %d %s", tc.command, rec.Code, rec.Body)
		}
		if rec := f.do("POST", "/api/sandboxes/"+f.sandbox+"/exec", `{"command":"`+tc.command+`"}`); rec.Code != tc.status {
			t.Errorf("%s not streamed: %d %s", tc.command, rec.Code, rec.Body)
		}
	}
}

// TestExecPTYBody checks the pty field through POST .../exec: the size
// reaches the service, and a bad one is the contract's 400 body.
func TestExecPTYBody(t *testing.T) {
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprintf(stdout, "%v", req.PTY)
		return sandbox.ExecResult{}, nil
	})
	rec := f.do("POST", "/api/sandboxes/"+f.sandbox+"/exec", `{"command":"sh","pty":{"rows":30,"cols":90}}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"stdout":"&{30 90}"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = f.do("POST", "/api/sandboxes/"+f.sandbox+"/exec", `{"command":"sh","pty":{"rows":30,"cols":0}}`)
	var body map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != 400 || body["error"] != "pty.cols must be between 1 and 1000" || fmt.Sprint(body["missing_fields"]) != "[pty cols]" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// execFunc is the fake's process: what a command does with its request.
type execFunc func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error)

// fakeExec is the sandbox service at the process boundary: Exec runs
// the test's function; nothing else is called.
type fakeExec struct {
	SandboxService
	run execFunc
}

func (f fakeExec) Exec(ctx context.Context, _ auth.Principal, _ string, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	return f.run(ctx, req, stdout, stderr)
}

// wsFixture is an API server on a real listener (websockets hijack the
// connection) whose sandboxes run a fake process, with a running sandbox
// of the fixture's account, a stopped one, one of another account, and
// the running sandbox's own key.
type wsFixture struct {
	*fixture
	ts                      *httptest.Server
	sandbox, stopped, other string
	sandboxKey              string
}

func newWSFixture(t *testing.T, run execFunc) *wsFixture {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	bob := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &bob); err != nil {
		t.Fatal(err)
	}
	w := &wsFixture{fixture: f, sandbox: "sbx_ws_running", stopped: "sbx_ws_stopped", other: "sbx_ws_other"}
	for _, sb := range []store.Sandbox{
		{ID: w.sandbox, AccountID: f.account.ID, Status: store.SandboxRunning},
		{ID: w.stopped, AccountID: f.account.ID, Status: store.SandboxStopped},
		{ID: w.other, AccountID: bob.ID, Status: store.SandboxRunning},
	} {
		sb.NodeID, sb.Runtime, sb.Deadline = "node", "gvisor", time.Now().Add(time.Hour)
		if err := f.st.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
	}
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.CreateAPIKey(ctx, &store.APIKey{AccountID: f.account.ID, Prefix: prefix, Hash: hash, SandboxID: w.sandbox}); err != nil {
		t.Fatal(err)
	}
	w.sandboxKey = plaintext
	f.srv, err = New(Options{Store: f.st, Auth: auth.NewAuthenticator(f.st), Version: "test", Sandboxes: fakeExec{run: run}})
	if err != nil {
		t.Fatal(err)
	}
	w.ts = httptest.NewServer(f.srv)
	t.Cleanup(w.ts.Close)
	return w
}

// dial opens the exec websocket of sandbox id with the fixture's key.
func (w *wsFixture) dial(t *testing.T, id string) *websocket.Conn {
	t.Helper()
	conn, resp, err := w.dialWith(id, "", &websocket.DialOptions{HTTPHeader: http.Header{"x-api-key": {w.key}}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { conn.CloseNow() })
	conn.SetReadLimit(1 << 20)
	return conn
}

func (w *wsFixture) dialWith(id, query string, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, w.ts.URL+"/api/sandboxes/"+id+"/exec"+query, opts)
}

// session is what a client saw of an interactive exec.
type session struct {
	stdout, stderr strings.Builder
	end            map[string]any
	closed         error // the read error after the end: the server's close
}

// send writes one message or fails the test.
func send(t *testing.T, conn *websocket.Conn, typ websocket.MessageType, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Write(ctx, typ, []byte(msg)); err != nil {
		t.Fatalf("send %q: %v", msg, err)
	}
}

// readUntil reads messages into s until until(s) holds or the end
// message came (then it also reads the close).
func readUntil(t *testing.T, conn *websocket.Conn, s *session, until func(*session) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for (until == nil || !until(s)) && s.end == nil {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (stdout %q, stderr %q)", err, s.stdout.String(), s.stderr.String())
		}
		if typ == websocket.MessageText {
			if err := json.Unmarshal(msg, &s.end); err != nil {
				t.Fatalf("text message %q: %v", msg, err)
			}
			_, _, s.closed = conn.Read(ctx)
			return
		}
		switch {
		case len(msg) > 0 && msg[0] == 1:
			s.stdout.Write(msg[1:])
		case len(msg) > 0 && msg[0] == 2:
			s.stderr.Write(msg[1:])
		default:
			t.Fatalf("binary message without a stream: %q", msg)
		}
	}
}

// TestExecWebsocket drives one session through every message of the
// protocol against a process that echoes its input and reports its
// resizes and signals.
func TestExecWebsocket(t *testing.T) {
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		if req.Command != "sh" || fmt.Sprint(req.Args) != "[-i]" || fmt.Sprint(req.PTY) != "&{24 80}" || req.Cwd != "/tmp" || req.Env["A"] != "b" {
			return sandbox.ExecResult{}, fmt.Errorf("request %+v", req)
		}
		fmt.Fprint(stderr, "ready\n")
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(stdout, req.Input)
		}()
		for {
			select {
			case ws := <-req.Resize:
				fmt.Fprintf(stderr, "size %dx%d\n", ws.Rows, ws.Cols)
			case sig := <-req.Signal:
				fmt.Fprintf(stderr, "signal %d\n", sig)
			case <-done:
				return sandbox.ExecResult{ExitCode: 7}, nil
			case <-ctx.Done():
				return sandbox.ExecResult{}, ctx.Err()
			}
		}
	})
	conn := f.dial(t, f.sandbox)
	var s session
	send(t, conn, websocket.MessageText, `{"command":"sh","args":["-i"],"cwd":"/tmp","env":{"A":"b"},"stdin":"first ","pty":{"rows":24,"cols":80}}`)
	readUntil(t, conn, &s, func(s *session) bool { return s.stderr.String() == "ready\n" && s.stdout.String() == "first " })
	send(t, conn, websocket.MessageBinary, "hello")
	readUntil(t, conn, &s, func(s *session) bool { return s.stdout.String() == "first hello" })
	send(t, conn, websocket.MessageText, `{"type":"resize","rows":30,"cols":100}`)
	readUntil(t, conn, &s, func(s *session) bool { return strings.HasSuffix(s.stderr.String(), "size 30x100\n") })
	for _, sig := range []string{"SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT"} {
		send(t, conn, websocket.MessageText, `{"type":"signal","signal":"`+sig+`"}`)
	}
	readUntil(t, conn, &s, func(s *session) bool { return strings.HasSuffix(s.stderr.String(), "signal 3\n") })
	if want := "ready\nsize 30x100\nsignal 2\nsignal 15\nsignal 9\nsignal 1\nsignal 3\n"; s.stderr.String() != want {
		t.Fatalf("stderr %q, want %q", s.stderr.String(), want)
	}
	send(t, conn, websocket.MessageText, `{"type":"eof"}`)
	readUntil(t, conn, &s, nil)
	if s.end["type"] != "exit" || s.end["exitCode"] != 7.0 || s.end["oomKilled"] != false || s.end["durationMs"] == nil || len(s.end) != 4 {
		t.Fatalf("end %v", s.end)
	}
	if websocket.CloseStatus(s.closed) != websocket.StatusNormalClosure {
		t.Fatalf("after the end: %v, want a normal close", s.closed)
	}
}

// TestExecWebsocketEnd: the end message reaches the client however soon
// the command ends, with the client still reading (the server's read
// that waits for the client's next message must not close the socket).
func TestExecWebsocketEnd(t *testing.T) {
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprint(stdout, "bye")
		return sandbox.ExecResult{ExitCode: 3, OOMKilled: true}, nil
	})
	for i := range 50 {
		conn := f.dial(t, f.sandbox)
		var s session
		send(t, conn, websocket.MessageText, `{"command":"true"}`)
		readUntil(t, conn, &s, nil)
		if s.stdout.String() != "bye" || s.end["type"] != "exit" || s.end["exitCode"] != 3.0 || s.end["oomKilled"] != true {
			t.Fatalf("session %d: stdout %q, end %v", i, s.stdout.String(), s.end)
		}
		if websocket.CloseStatus(s.closed) != websocket.StatusNormalClosure {
			t.Fatalf("session %d: after the end: %v", i, s.closed)
		}
		conn.CloseNow()
	}
}

// TestExecWebsocketCloseKills: a client that goes away ends the command's
// context, which is what kills it in the sandbox.
func TestExecWebsocketCloseKills(t *testing.T) {
	ended := make(chan error, 1)
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprint(stdout, "running")
		<-ctx.Done()
		ended <- ctx.Err()
		return sandbox.ExecResult{}, ctx.Err()
	})
	conn := f.dial(t, f.sandbox)
	var s session
	send(t, conn, websocket.MessageText, `{"command":"sleep","args":["1000"]}`)
	readUntil(t, conn, &s, func(s *session) bool { return s.stdout.String() == "running" })
	conn.CloseNow()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the command's context ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the command still runs after its client went away")
	}
}

// TestExecWebsocketRefusals: a bad command or control message, or one too
// large, ends the session with what was wrong and kills the command.
func TestExecWebsocketRefusals(t *testing.T) {
	securitytest.Attack(t, "api", "an exec websocket client sends a binary or malformed first message, an invalid command, malformed controls (bad JSON, unknown type, a 0x80 or 1001-row resize, SIGUSR1, SIGSTOP), input after eof, and a 1 MiB message",
		"each ends the session with an error message naming the fault (or, for the oversized message, a 1009 close) and the command's context is cancelled; nothing is passed on")
	type cmdEnd struct{ err error }
	ended := make(chan cmdEnd, 1)
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprint(stdout, "running")
		for {
			select {
			case <-req.Resize:
				return sandbox.ExecResult{}, errors.New("an invalid resize reached the command")
			case <-req.Signal:
				return sandbox.ExecResult{}, errors.New("an invalid signal reached the command")
			case <-ctx.Done():
				ended <- cmdEnd{ctx.Err()}
				return sandbox.ExecResult{}, ctx.Err()
			}
		}
	})
	first := []struct {
		typ    websocket.MessageType
		msg    string
		err    string
		fields string
	}{
		{websocket.MessageBinary, `{"command":"sh"}`, "The first message must be text: the JSON body of POST /api/sandboxes/{id}/exec", "[]"},
		{websocket.MessageText, `{"command":`, "Request body must be valid JSON", "[]"},
		{websocket.MessageText, `[1]`, "Request body must be a JSON object", "[]"},
		{websocket.MessageText, `{"command":""}`, "command cannot be empty", "[command]"},
		{websocket.MessageText, `{"command":"sh","pty":{"rows":0,"cols":80}}`, "pty.rows must be between 1 and 1000", "[pty rows]"},
		{websocket.MessageText, `{"command":"sh","timeout":-1}`, "timeout must be a positive number of milliseconds", "[timeout]"},
		{websocket.MessageText, `{"command":"sh","account_id":"nope"}`, "account_id must be a valid UUID", "[account_id]"},
	}
	for _, tc := range first {
		conn := f.dial(t, f.sandbox)
		var s session
		send(t, conn, tc.typ, tc.msg)
		readUntil(t, conn, &s, nil)
		if s.end["type"] != "error" || s.end["error"] != tc.err || fmt.Sprint(s.end["missing_fields"]) != strings.Replace(tc.fields, "[]", "<nil>", 1) {
			t.Errorf("first message %q: end %v, want %q on %s", tc.msg, s.end, tc.err, tc.fields)
		}
		if websocket.CloseStatus(s.closed) != websocket.StatusNormalClosure {
			t.Errorf("first message %q: then %v", tc.msg, s.closed)
		}
		conn.CloseNow()
	}
	after := []struct {
		msgs   []string // "bin:" starts a binary message
		err    string
		fields string
	}{
		{[]string{`resize`}, `A text message after the command must be a control: a JSON object with "type" resize, signal or eof`, "<nil>"},
		{[]string{`{"type":"winch"}`}, "type must be one of resize, signal, eof", "[type]"},
		{[]string{`{"rows":24,"cols":80}`}, "type must be one of resize, signal, eof", "[type]"},
		{[]string{`{"type":"resize","rows":0,"cols":80}`}, "rows must be between 1 and 1000", "[rows]"},
		{[]string{`{"type":"resize","rows":24,"cols":1001}`}, "cols must be between 1 and 1000", "[cols]"},
		{[]string{`{"type":"resize","rows":24}`}, "cols must be between 1 and 1000", "[cols]"},
		{[]string{`{"type":"resize","rows":"24","cols":80}`}, "rows must be an integer", "[rows]"},
		{[]string{`{"type":"signal","signal":"SIGUSR1"}`}, "signal must be one of SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT", "[signal]"},
		{[]string{`{"type":"signal","signal":"SIGSTOP"}`}, "signal must be one of SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT", "[signal]"},
		{[]string{`{"type":"signal"}`}, "signal must be one of SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT", "[signal]"},
		{[]string{`{"type":"signal","signal":9}`}, "Expected string, received number", "[signal]"},
		{[]string{`{"type":"eof"}`, "bin:late"}, "Input after eof", "<nil>"},
	}
	for _, tc := range after {
		conn := f.dial(t, f.sandbox)
		var s session
		send(t, conn, websocket.MessageText, `{"command":"cat"}`)
		readUntil(t, conn, &s, func(s *session) bool { return s.stdout.String() == "running" })
		for _, m := range tc.msgs {
			if b, ok := strings.CutPrefix(m, "bin:"); ok {
				send(t, conn, websocket.MessageBinary, b)
			} else {
				send(t, conn, websocket.MessageText, m)
			}
		}
		readUntil(t, conn, &s, nil)
		if s.end["type"] != "error" || s.end["error"] != tc.err || fmt.Sprint(s.end["missing_fields"]) != tc.fields {
			t.Errorf("%q: end %v, want %q on %s", tc.msgs, s.end, tc.err, tc.fields)
		}
		select {
		case e := <-ended:
			if !errors.Is(e.err, context.Canceled) {
				t.Errorf("%q: the command ended with %v", tc.msgs, e.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: the command still runs", tc.msgs)
		}
		conn.CloseNow()
	}

	// A message over the limit closes the socket (and kills the command).
	conn := f.dial(t, f.sandbox)
	var s session
	send(t, conn, websocket.MessageText, `{"command":"cat"}`)
	readUntil(t, conn, &s, func(s *session) bool { return s.stdout.String() == "running" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = conn.Write(ctx, websocket.MessageBinary, make([]byte, 1<<20))
	_, _, err := conn.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("after 1 MiB: %v, want a 1009 close", err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the command still runs after an oversized message")
	}
}

// TestExecWebsocketAccess: the refusals come before the upgrade, with the
// statuses of POST .../exec and the API's error bodies.
func TestExecWebsocketAccess(t *testing.T) {
	securitytest.Attack(t, "keys", "code in a sandbox opens GET /api/sandboxes/{id}/exec (a websocket, so a GET) with its RECOUP_API_KEY to run commands, which POST .../exec refuses it",
		"403 before the upgrade, with the message saying the key is a sandbox's; the command never starts")
	var mu sync.Mutex
	var ran []string
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		mu.Lock()
		ran = append(ran, req.Command)
		mu.Unlock()
		return sandbox.ExecResult{}, nil
	})
	ws := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-WebSocket-Version": {"13"}, "Sec-WebSocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	with := func(h http.Header, kv ...string) http.Header {
		h = h.Clone()
		if h == nil {
			h = http.Header{}
		}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	cases := []struct {
		name   string
		path   string
		header http.Header
		status int
		err    string
	}{
		{"not an upgrade", f.sandbox, with(nil, "x-api-key", f.key), 426, "GET /api/sandboxes/{id}/exec is a websocket (Upgrade: websocket); POST /api/sandboxes/{id}/exec runs a command without one"},
		{"no key", f.sandbox, ws, 401, "Exactly one of x-api-key or Authorization must be provided"},
		{"wrong key", f.sandbox, with(ws, "Authorization", "Bearer sbx_wrong"), 401, "Unauthorized"},
		{"two keys", f.sandbox, with(ws, "x-api-key", f.key, "Authorization", "Bearer "+f.key), 401, "Exactly one of x-api-key or Authorization must be provided"},
		{"a sandbox's key", f.sandbox, with(ws, "x-api-key", f.sandboxKey), 403, "This key belongs to a sandbox and may only read (GET) the API, use the git server and the model proxy; GET /api/sandboxes/" + f.sandbox + "/exec (it runs a command) needs an account key"},
		{"a sandbox's key as the subprotocol", f.sandbox, with(ws, "Sec-WebSocket-Protocol", keyProtocolPrefix+f.sandboxKey), 403, ""},
		{"another account's sandbox", f.other, with(ws, "x-api-key", f.key), 404, "Sandbox not found"},
		{"an unknown sandbox", "sbx_unknown", with(ws, "x-api-key", f.key), 404, "Sandbox not found"},
		{"a stopped sandbox", f.stopped, with(ws, "x-api-key", f.key), 409, "Sandbox is not running"},
		{"a bad account_id", f.sandbox + "/exec?account_id=nope", with(ws, "x-api-key", f.key), 400, "account_id must be a valid UUID"},
		{"a key subprotocol and a header", f.sandbox, with(ws, "x-api-key", f.key, "Sec-WebSocket-Protocol", keyProtocolPrefix+f.key), 401, "Exactly one of x-api-key or Authorization must be provided"},
		{"two key subprotocols", f.sandbox, with(ws, "Sec-WebSocket-Protocol", keyProtocolPrefix+f.key+", "+keyProtocolPrefix+f.key), 401, "Exactly one of x-api-key or Authorization must be provided"},
		{"a wrong key subprotocol", f.sandbox, with(ws, "Sec-WebSocket-Protocol", keyProtocolPrefix+"sbx_wrong"), 401, "Unauthorized"},
		{"an empty key subprotocol", f.sandbox, with(ws, "Sec-WebSocket-Protocol", keyProtocolPrefix), 401, "Unauthorized"},
		{"a key subprotocol without an upgrade", f.sandbox, http.Header{"Sec-WebSocket-Protocol": {keyProtocolPrefix + f.key}}, 401, "Exactly one of x-api-key or Authorization must be provided"},
	}
	for _, tc := range cases {
		path := "/api/sandboxes/" + tc.path
		if !strings.Contains(tc.path, "/") {
			path += "/exec"
		}
		req := httptest.NewRequest("GET", path, nil)
		req.Header = tc.header
		rec := httptest.NewRecorder()
		f.srv.ServeHTTP(rec, req)
		var body ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tc.status || body.Status != "error" || (tc.err != "" && body.Error != tc.err) {
			t.Errorf("%s: %d %s, want %d %q", tc.name, rec.Code, rec.Body, tc.status, tc.err)
		}
	}
	// Other routes do not take the key as a subprotocol, even on an
	// upgrade (the proxy's websockets forward the handshake's headers).
	req := httptest.NewRequest("GET", "/api/sandboxes", nil)
	req.Header = with(ws, "Sec-WebSocket-Protocol", keyProtocolPrefix+f.key)
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req)
	if rec.Code != 401 {
		t.Errorf("GET /api/sandboxes with the key as a subprotocol: %d %s", rec.Code, rec.Body)
	}
	mu.Lock()
	if len(ran) != 0 {
		t.Fatalf("commands ran: %v", ran)
	}
	mu.Unlock()

	// The key as the subprotocol (what a browser can send), selected in the
	// answer as browsers require; from another origin too (no credential is
	// ambient); account_id in the query or the first message.
	for _, tc := range []struct{ query, first string }{
		{"", `{"command":"one"}`},
		{"?account_id=" + f.account.ID, `{"command":"two"}`},
		{"", `{"command":"three","account_id":"` + f.account.ID + `"}`},
	} {
		proto := keyProtocolPrefix + f.key
		conn, _, err := f.dialWith(f.sandbox, tc.query, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPHeader: http.Header{"Origin": {"https://elsewhere.example"}}})
		if err != nil {
			t.Fatalf("dial with the key as the subprotocol: %v", err)
		}
		if conn.Subprotocol() != proto {
			t.Errorf("subprotocol %q selected", conn.Subprotocol())
		}
		var s session
		send(t, conn, websocket.MessageText, tc.first)
		readUntil(t, conn, &s, nil)
		if s.end["type"] != "exit" {
			t.Errorf("%s %s: end %v", tc.query, tc.first, s.end)
		}
		conn.CloseNow()
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(ran) != "[one two three]" {
		t.Fatalf("commands ran: %v", ran)
	}
}

// TestExecWebsocketAccountInMessage: an account_id in the first message
// that the key may not act for is refused as in POST .../exec.
func TestExecWebsocketAccountInMessage(t *testing.T) {
	f := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{}, errors.New("the command ran")
	})
	other, err := f.st.GetSandbox(context.Background(), f.other)
	if err != nil {
		t.Fatal(err)
	}
	conn := f.dial(t, f.sandbox)
	var s session
	send(t, conn, websocket.MessageText, `{"command":"sh","account_id":"`+other.AccountID+`"}`)
	readUntil(t, conn, &s, nil)
	if s.end["type"] != "error" || s.end["error"] != "Access denied to specified account_id" {
		t.Fatalf("end %v", s.end)
	}
}

// TestOpenAPIExecWebsocket: the route table documents the websocket.
func TestOpenAPIExecWebsocket(t *testing.T) {
	f := newFixture(t)
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]any `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(f.srv.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	op, ok := doc.Paths["/api/sandboxes/{id}/exec"]["get"]
	if !ok || op.Responses["101"] == nil || op.Responses["426"] == nil {
		t.Fatalf("GET /api/sandboxes/{id}/exec: %+v", op)
	}
	if _, ok := doc.Paths["/api/sandboxes/{id}/exec"]["post"]; !ok {
		t.Fatal("POST /api/sandboxes/{id}/exec is gone")
	}
}
