package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestExecOutlivesItsClient: the command of POST .../exec belongs to the
// sandbox, not to the request that started it. Its client hanging up
// leaves it running (listed with the sandbox's processes, ending on its
// own); one started with killOnDisconnect dies with its client.
func TestExecOutlivesItsClient(t *testing.T) {
	s := startServer(t, "")
	k := s.createKey(s.createAccount("hangup", false).ID)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	exec := "/api/sandboxes/" + id + "/exec"
	// Each waits for /tmp/go, then leaves its mark.
	waiter := func(name string) []string {
		return []string{"-c", "echo started; while [ ! -e /tmp/go ]; do sleep 1; done; echo done > /tmp/" + name}
	}
	before := s.finishedRequests(exec)
	s.hangUp(k, exec, map[string]any{"command": "sh", "args": waiter("survivor")})
	s.hangUp(k, exec, map[string]any{"command": "sh", "args": waiter("killed"), "killOnDisconnect": true})
	// The server is done with both requests: a command that dies with its
	// client is dead by then.
	for s.finishedRequests(exec) < before+2 {
		time.Sleep(50 * time.Millisecond)
	}
	r := s.as(k, "GET", "/api/sandboxes/"+id+"/processes", nil)
	listed := string(r.Raw)
	if r.Status != 200 || !strings.Contains(listed, "/tmp/survivor") || strings.Contains(listed, "/tmp/killed") {
		t.Fatalf("processes after both clients hung up: %d %s", r.Status, listed)
	}
	if r := s.as(k, "POST", exec, map[string]any{"command": "touch", "args": []string{"/tmp/go"}}); r.Status != 200 {
		t.Fatalf("touch /tmp/go: %d %s", r.Status, r.Raw)
	}
	check := map[string]any{"command": "sh", "args": []string{"-c", "cat /tmp/survivor; ls /tmp/killed 2>/dev/null; true"}}
	deadline := time.Now().Add(time.Minute)
	for {
		r := s.as(k, "POST", exec, check)
		if r.Body["stdout"] == "done\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the surviving command did not finish: %d %s", r.Status, r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.stopAll(k)
}

// hangUp starts a streamed exec and goes away once its command printed.
func (s *server) hangUp(k key, path string, body map[string]any) {
	s.t.Helper()
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.base+path, strings.NewReader(string(data)))
	req.Header.Set("x-api-key", k.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("exec %s: %v", data, err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			s.t.Fatalf("exec %s ended before its command printed: %v", data, err)
		}
		if strings.Contains(line, `"data":"started\n"`) {
			return // cancel, on return, is the client going away
		}
	}
}

// finishedRequests counts the requests of route path (a sandbox's, its id
// matched by the pattern) that the server finished, from its metrics.
func (s *server) finishedRequests(path string) int {
	s.t.Helper()
	resp, err := http.Get(s.metrics + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	pattern := regexp.MustCompile(`/api/sandboxes/[^/]+/`).ReplaceAllString(path, "/api/sandboxes/{id}/")
	line := regexp.MustCompile(`(?m)^sandboxd_http_requests_total\{method="POST",route="` + regexp.QuoteMeta(pattern) + `",status="\d+"\} (\d+)$`)
	n := 0
	for _, m := range line.FindAllStringSubmatch(string(raw), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}
