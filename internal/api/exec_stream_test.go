package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// TestExecStreamKeepsCharactersWhole: output arrives in chunks that cut
// UTF-8 characters anywhere (the agent reads a pipe); each SSE event's
// data is a JSON string, so a cut character must travel whole in one
// event, not as two halves turned into U+FFFD. A character the output
// never finishes still arrives, as U+FFFD, before the exit event.
func TestExecStreamKeepsCharactersWhole(t *testing.T) {
	w := newWSFixture(t, func(_ context.Context, _ sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		euro := []byte("€") // e2 82 ac
		for _, part := range [][]byte{[]byte("a"), euro[:1], euro[1:2], append(euro[2:3:3], 'b', euro[0]), euro[1:], []byte("😀")[:3]} {
			if _, err := stdout.Write(part); err != nil {
				return sandbox.ExecResult{}, err
			}
		}
		if _, err := stderr.Write([]byte{0xff, 'x'}); err != nil { // not UTF-8 at all: passed on as it is
			return sandbox.ExecResult{}, err
		}
		return sandbox.ExecResult{ExitCode: 3}, nil
	})
	req, _ := http.NewRequest("POST", w.ts.URL+"/api/sandboxes/"+w.sandbox+"/exec", strings.NewReader(`{"command":"sh"}`))
	req.Header.Set("x-api-key", w.key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := map[string]string{}
	var names []string
	sc := bufio.NewScanner(resp.Body)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
			names = append(names, name)
		case strings.HasPrefix(line, "data: "):
			var ev struct {
				Data     string `json:"data"`
				ExitCode *int   `json:"exitCode"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				t.Fatalf("event %s: %v", name, err)
			}
			if ev.Data == "" && name != "exit" {
				t.Errorf("an empty %s event", name)
			}
			got[name] += ev.Data
		}
	}
	if want := "a€b€\ufffd\ufffd\ufffd"; got["stdout"] != want {
		t.Errorf("stdout %q, want %q", got["stdout"], want)
	}
	if want := "\ufffdx"; got["stderr"] != want {
		t.Errorf("stderr %q, want %q", got["stderr"], want)
	}
	if len(names) == 0 || names[len(names)-1] != "exit" {
		t.Errorf("events %v: want the exit last", names)
	}
}
