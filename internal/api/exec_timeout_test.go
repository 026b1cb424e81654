package api

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// TestExecTimedOut: a command killed at its timeout says so in every form
// of exec (timedOut: true), not only by the kill's exit code, and one that
// ended by itself carries no such field.
func TestExecTimedOut(t *testing.T) {
	w := newWSFixture(t, func(_ context.Context, req sandbox.ExecRequest, _, _ io.Writer) (sandbox.ExecResult, error) {
		if req.Command == "sleep" {
			return sandbox.ExecResult{ExitCode: 137, TimedOut: true}, nil
		}
		return sandbox.ExecResult{}, nil
	})
	exec := "/api/sandboxes/" + w.sandbox + "/exec"

	if rec := w.do("POST", exec, `{"command":"sleep","timeout":10}`); !strings.Contains(rec.Body.String(), `"exitCode":137`) || !strings.Contains(rec.Body.String(), `"timedOut":true`) {
		t.Errorf("whole result: %d %s", rec.Code, rec.Body)
	}
	if rec := w.do("POST", exec, `{"command":"true"}`); strings.Contains(rec.Body.String(), "timedOut") {
		t.Errorf("a command that ended by itself: %s", rec.Body)
	}

	req := httptest.NewRequest("POST", exec, strings.NewReader(`{"command":"sleep","timeout":10}`))
	req.Header.Set("x-api-key", w.key)
	req.Header.Set("Accept", "text/event-stream")
	rec := httptest.NewRecorder()
	w.srv.ServeHTTP(rec, req)
	if !strings.Contains(rec.Body.String(), "event: exit\ndata: {\"durationMs\":") || !strings.Contains(rec.Body.String(), `"exitCode":137,"timedOut":true}`) {
		t.Errorf("stream: %s", rec.Body)
	}

	conn := w.dial(t, w.sandbox)
	send(t, conn, websocket.MessageText, `{"command":"sleep","timeout":10}`)
	var s session
	readUntil(t, conn, &s, nil)
	if s.end["type"] != "exit" || s.end["exitCode"] != 137.0 || s.end["timedOut"] != true {
		t.Errorf("websocket end: %v", s.end)
	}
}
