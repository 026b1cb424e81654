package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
)

// dirLogs opens run logs from a directory, as runs.Logs does from
// DATA_DIR/runs.
type dirLogs string

func (d dirLogs) OpenRunLog(id string) (*os.File, error) {
	return os.Open(filepath.Join(string(d), id+".log"))
}

// sseEvent is one Server-Sent Event.
type sseEvent struct{ name, data string }

// readEvents reads events from an SSE body onto a channel until it ends.
func readEvents(t *testing.T, resp *http.Response) <-chan sseEvent {
	t.Helper()
	out := make(chan sseEvent, 64)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case line == "" && ev.name != "":
				out <- ev
				ev = sseEvent{}
			}
		}
	}()
	return out
}

func next(t *testing.T, events <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("the stream ended early")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10 s")
	}
	return sseEvent{}
}

func logData(t *testing.T, ev sseEvent) string {
	t.Helper()
	if ev.name != "log" {
		t.Fatalf("want a log event, got %s %s", ev.name, ev.data)
	}
	var out contract.ExecOutput
	if err := json.Unmarshal([]byte(ev.data), &out); err != nil {
		t.Fatal(err)
	}
	return out.Data
}

// TestRunLogFollows: the stream sends what the log has, then what is
// written to it while the run executes (a character split between two
// writes arrives whole), then the run's end.
func TestRunLogFollows(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	dir := t.TempDir()
	f.srv.opts.RunLogs = dirLogs(dir)
	run := store.Run{AccountID: f.account.ID, Task: "run-sandbox-command", Status: store.RunQueued, Payload: json.RawMessage(`{}`)}
	if err := f.st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(f.srv)
	defer ts.Close()
	get := func(path, key string) *http.Response {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	// Queued: no log yet; the stream waits for it.
	resp := get("/api/tasks/runs/"+run.ID+"/log", f.key)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := readEvents(t, resp)
	if _, err := f.st.StartRun(ctx, run.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, run.ID+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	write := func(s string) {
		if _, err := logFile.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write("[stdout] hello\n")
	if got := logData(t, next(t, events)); got != "[stdout] hello\n" {
		t.Fatalf("first: %q", got)
	}
	// "é" is two bytes: the first alone is held back.
	write("[stderr] caf\xc3")
	if got := logData(t, next(t, events)); got != "[stderr] caf" {
		t.Fatalf("split: %q", got)
	}
	write("\xa9\n")
	if got := logData(t, next(t, events)); got != "é\n" {
		t.Fatalf("rest: %q", got)
	}
	write("[stdout] last\n")
	if _, err := f.st.FinishRun(ctx, run.ID, store.RunCompleted, json.RawMessage(`{"exitCode":0}`), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	var text string
	for {
		ev := next(t, events)
		if ev.name == "end" {
			if ev.data != `{"status":"COMPLETED"}` {
				t.Fatalf("end: %s", ev.data)
			}
			break
		}
		text += logData(t, ev)
	}
	if text != "[stdout] last\n" {
		t.Fatalf("after the first events: %q", text)
	}
	if _, ok := <-events; ok {
		t.Fatal("events after the end")
	}

	// A finished run answers its whole log at once, then its end.
	resp2 := get("/api/tasks/runs/"+run.ID+"/log", f.key)
	defer resp2.Body.Close()
	events = readEvents(t, resp2)
	if got := logData(t, next(t, events)); got != "[stdout] hello\n[stderr] café\n[stdout] last\n" {
		t.Fatalf("whole log: %q", got)
	}
	if ev := next(t, events); ev.name != "end" {
		t.Fatalf("want the end, got %s", ev.name)
	}

	// Another account's run is as unknown as a missing one.
	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	theirs := store.Run{AccountID: other.ID, Task: "run-sandbox-command", Payload: json.RawMessage(`{}`)}
	if err := f.st.CreateRun(ctx, &theirs); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{theirs.ID, "run_missing"} {
		rec := f.do("GET", "/api/tasks/runs/"+id+"/log", "")
		if rec.Code != 404 || !strings.Contains(rec.Body.String(), "Task run not found") {
			t.Errorf("%s: %d %s", id, rec.Code, rec.Body)
		}
	}
	if rec := f.do("GET", "/api/tasks/runs/"+run.ID+"/log?account_id="+other.ID, ""); rec.Code != 403 {
		t.Errorf("another account_id: %d %s", rec.Code, rec.Body)
	}
	// Without the service: 501 after the checks.
	f.srv.opts.RunLogs = nil
	if rec := f.do("GET", "/api/tasks/runs/"+run.ID+"/log", ""); rec.Code != 501 {
		t.Errorf("no service: %d %s", rec.Code, rec.Body)
	}
}

func TestSplitUTF8(t *testing.T) {
	for _, tc := range []struct{ in, whole, rest string }{
		{"abc", "abc", ""},
		{"ab\xc3", "ab", "\xc3"},
		{"ab\xe2\x82", "ab", "\xe2\x82"},
		{"ab\xe2\x82\xac", "ab\xe2\x82\xac", ""},
		{"\xff\xff", "\xff\xff", ""}, // invalid stays: JSON marks it
		{"", "", ""},
	} {
		w, r := splitUTF8([]byte(tc.in))
		if string(w) != tc.whole || string(r) != tc.rest {
			t.Errorf("%q: %q %q", tc.in, w, r)
		}
	}
}
