package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestExecKillOnDisconnect: what an exec asks the sandbox service about
// its client going away. POST .../exec's command survives its client
// unless the body says killOnDisconnect; the websocket's always dies
// with its socket; an MCP tool call's with its request.
func TestExecKillOnDisconnect(t *testing.T) {
	w := newWSFixture(t, func(_ context.Context, req sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprintf(stdout, "detach=%v", req.Detach)
		return sandbox.ExecResult{}, nil
	})
	exec := "/api/sandboxes/" + w.sandbox + "/exec"
	for body, want := range map[string]string{
		`{"command":"sh"}`:                          `"stdout":"detach=true"`,
		`{"command":"sh","killOnDisconnect":false}`: `"stdout":"detach=true"`,
		`{"command":"sh","killOnDisconnect":null}`:  `"stdout":"detach=true"`,
		`{"command":"sh","killOnDisconnect":true}`:  `"stdout":"detach=false"`,
		`{"command":"sh","killOnDisconnect":"yes"}`: `{"status":"error","error":"Expected boolean, received string","missing_fields":["killOnDisconnect"]}`,
	} {
		if rec := w.do("POST", exec, body); !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s: %d %s, want %s", body, rec.Code, rec.Body, want)
		}
	}

	for first, want := range map[string]string{
		`{"command":"sh"}`:                          "detach=false",
		`{"command":"sh","killOnDisconnect":true}`:  "detach=false",
		`{"command":"sh","killOnDisconnect":false}`: "killOnDisconnect cannot be false on the websocket: an interactive command ends when its socket closes",
	} {
		conn := w.dial(t, w.sandbox)
		send(t, conn, websocket.MessageText, first)
		var s session
		readUntil(t, conn, &s, nil)
		if got := s.stdout.String() + fmt.Sprint(s.end["error"]); !strings.Contains(got, want) {
			t.Errorf("websocket %s: %q, want %q", first, got, want)
		}
	}

	args, err := contract.DecodeArgs([]byte(`{"command":"sh","killOnDisconnect":false}`))
	if err != nil {
		t.Fatal(err)
	}
	if req, err := args.Exec(); err != nil || req.Domain().Detach {
		t.Errorf("an MCP tool's exec: %+v, %v; it must die with its call", req, err)
	}
}

// TestExecStreamOutlivesItsClient: a streamed exec whose client goes away
// keeps its command's output flowing into nothing, instead of failing
// the writes, which would make the agent kill the command.
func TestExecStreamOutlivesItsClient(t *testing.T) {
	securitytest.Attack(t, "processes", "a caller streams POST /api/sandboxes/{id}/exec and drops its connection mid-command (docs/API.md: processes survive their caller)",
		"the command's output flows on into nothing and the command runs on (killed only when the request said killOnDisconnect); before, the failed writes made the agent kill it")
	writes := make(chan error, 1)
	w := newWSFixture(t, func(ctx context.Context, req sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
		fmt.Fprint(stdout, "started")
		<-ctx.Done() // the client went away
		var failed error
		for range 200 { // enough to meet the closed connection
			if _, err := stdout.Write([]byte(strings.Repeat("o", 4<<10))); err != nil {
				failed = err
				break
			}
		}
		writes <- failed
		return sandbox.ExecResult{}, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", w.ts.URL+"/api/sandboxes/"+w.sandbox+"/exec", strings.NewReader(`{"command":"sleep"}`))
	req.Header.Set("x-api-key", w.key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "event: stdout\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	if err := <-writes; err != nil {
		t.Fatalf("the output after the client went: %v", err)
	}
}
