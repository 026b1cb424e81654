package api_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestTemplateLogStream: GET /api/templates/{id}/logs sends the build log
// as it grows, in "log" events, then one "end" event with the status and
// the failure reason; another account's template is 404.
func TestTemplateLogStream(t *testing.T) {
	ctx := t.Context()
	h, keys, st := templateAPI(t, templates.Config{})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(who, path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		req.Header.Set("x-api-key", keys[who])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/templates", strings.NewReader(`{"name":"app:1","image":"registry.example/app"}`))
	req.Header.Set("x-api-key", keys["alice"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var built struct{ Template struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&built); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("build: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	id := built.Template.ID

	if r := get("bob", "/api/templates/"+id+"/logs"); r.StatusCode != http.StatusNotFound {
		t.Fatalf("bob follows alice's build: %d", r.StatusCode)
	}
	stream := get("alice", "/api/templates/"+id+"/logs")
	if stream.StatusCode != http.StatusOK || !strings.HasPrefix(stream.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("follow: %d %s", stream.StatusCode, stream.Header.Get("Content-Type"))
	}
	events := make(chan [2]string)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stream.Body)
		var name string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				events <- [2]string{name, strings.TrimPrefix(line, "data: ")}
			}
		}
	}()
	next := func() (string, map[string]string) {
		t.Helper()
		ev, ok := <-events
		if !ok {
			t.Fatal("the stream ended early")
		}
		var data map[string]string
		if err := json.Unmarshal([]byte(ev[1]), &data); err != nil {
			t.Fatalf("event %s: %v", ev[0], err)
		}
		return ev[0], data
	}
	// The log so far (the queued line), then each line appended after.
	if name, data := next(); name != "log" || !strings.Contains(data["data"], "queued") {
		t.Fatalf("first event %s %v", name, data)
	}
	for _, line := range []string{"step 1/2: RUN make\n", "step 2/2: RUN make install\n"} {
		if err := st.AppendTemplateLog(ctx, id, line); err != nil {
			t.Fatal(err)
		}
		if name, data := next(); name != "log" || data["data"] != line {
			t.Fatalf("after appending %q: %s %v", line, name, data)
		}
	}
	if _, err := st.FinishTemplate(ctx, id, store.TemplateFailed, "", "", "step 2 (RUN make install) failed with exit code 2"); err != nil {
		t.Fatal(err)
	}
	if name, data := next(); name != "end" || data["status"] != "failed" || data["failureReason"] != "step 2 (RUN make install) failed with exit code 2" {
		t.Fatalf("end: %s %v", name, data)
	}
	if _, ok := <-events; ok {
		t.Fatal("events after the end")
	}
}
