package e2b

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// TestSandboxLogs: a sandbox's log is its lifecycle events, oldest first
// on v1 (a JSON line with level, logger and msg, as the e2b CLI parses it,
// and an entry); v2 pages backward, filters by level and search; start and
// cursor bound it; another account's sandbox is 404; bad parameters 400.
func TestSandboxLogs(t *testing.T) {
	f := newFixture(t, func(o *fixtureOptions) {
		svc, err := webhooks.New(webhooks.Config{Store: o.Store.(*store.Store), Key: bytes.Repeat([]byte{1}, 32)})
		if err != nil {
			t.Fatal(err)
		}
		o.Events = svc
	})
	alice := map[string]string{"X-API-Key": f.key}
	sb := f.create(f.key, map[string]any{"templateID": "base"})
	time.Sleep(2 * time.Millisecond)
	if err := f.st.SetSandboxDeadline(t.Context(), envd.SandboxID(sb.SandboxID), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}

	var v1 struct {
		Logs       []logLine  `json:"logs"`
		LogEntries []logEntry `json:"logEntries"`
	}
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID+"/logs", alice, nil, &v1); resp.StatusCode != 200 {
		t.Fatalf("logs: %d", resp.StatusCode)
	}
	if len(v1.Logs) != 2 || len(v1.LogEntries) != 2 || v1.LogEntries[0].Message != "sandbox created" || v1.LogEntries[1].Message != "sandbox updated" {
		t.Fatalf("logs %+v", v1)
	}
	var line map[string]string
	if err := json.Unmarshal([]byte(v1.Logs[0].Line), &line); err != nil {
		t.Fatal(err)
	}
	if line["level"] != "info" || line["logger"] != "lifecycle" || line["msg"] != "sandbox created" || line["event"] != store.EventCreated {
		t.Fatalf("line %q", v1.Logs[0].Line)
	}
	after := v1.LogEntries[1].Timestamp.UnixMilli()
	f.call("GET", "/sandboxes/"+sb.SandboxID+"/logs?start="+strconv.FormatInt(after, 10), alice, nil, &v1)
	if len(v1.Logs) != 1 || v1.LogEntries[0].Message != "sandbox updated" {
		t.Fatalf("from %d: %+v", after, v1)
	}

	var v2 struct {
		Logs []logEntry `json:"logs"`
	}
	path := "/v2/sandboxes/" + sb.SandboxID + "/logs"
	f.call("GET", path+"?direction=backward&limit=1", alice, nil, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Message != "sandbox updated" {
		t.Fatalf("backward: %+v", v2)
	}
	f.call("GET", path+"?direction=backward&cursor="+strconv.FormatInt(after-1, 10), alice, nil, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Message != "sandbox created" {
		t.Fatalf("backward before %d: %+v", after, v2)
	}
	f.call("GET", path+"?search=created", alice, nil, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Message != "sandbox created" {
		t.Fatalf("search: %+v", v2)
	}
	f.call("GET", path+"?level=warn", alice, nil, &v2)
	if len(v2.Logs) != 0 {
		t.Fatalf("level warn: %+v", v2)
	}
	for _, q := range []string{"direction=up", "level=loud", "cursor=x", "limit=-1"} {
		if resp := f.call("GET", path+"?"+q, alice, nil, nil); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d", q, resp.StatusCode)
		}
	}
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID+"/logs?start=-5", alice, nil, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("start -5: %d", resp.StatusCode)
	}
	bob := map[string]string{"X-API-Key": f.otherKey}
	for _, p := range []string{"/sandboxes/" + sb.SandboxID + "/logs", path} {
		if resp := f.call("GET", p, bob, nil, nil); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("bob reads alice's log at %s: %d", p, resp.StatusCode)
		}
	}
}

// TestLogEntryOfFailure: a failure is an error entry naming its reason;
// the event's data becomes string fields and cannot replace logger or
// event.
func TestLogEntryOfFailure(t *testing.T) {
	e := store.Event{Type: store.EventFailed, Data: json.RawMessage(`{"reason":"out of memory","code":137,"logger":"x"}`), CreatedAt: time.Now()}
	l := entryOf(e)
	if l.Level != "error" || l.Message != "sandbox failed: out of memory" || l.Fields["code"] != "137" || l.Fields["logger"] != "lifecycle" || l.Fields["event"] != store.EventFailed {
		t.Fatalf("entry %+v", l)
	}
	var line map[string]string
	if err := json.Unmarshal([]byte(l.line()), &line); err != nil || line["level"] != "error" || line["msg"] != l.Message {
		t.Fatalf("line %q: %v", l.line(), err)
	}
}
