package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestCLISandbox drives `sandboxd sandbox` (the API client) against a real
// server: create, ls, exec (streamed and --json), stop, an error answer and
// upload.
// The CLI talks through the Go client generated from the served OpenAPI
// document (package client), so this checks that the two agree on the wire.
func TestCLISandbox(t *testing.T) {
	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli", false).ID)
	cli := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append([]string{"sandbox", "--url", s.base, "--key", k.Key}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			code = exit.ExitCode()
		case err != nil:
			t.Fatalf("sandboxd sandbox %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errb.String(), code
	}

	out, errOut, code := cli("create", "--json")
	var sb struct {
		SandboxID     string `json:"sandboxId"`
		SandboxStatus string `json:"sandboxStatus"`
		Timeout       int64  `json:"timeout"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.SandboxID == "" || sb.SandboxStatus != "running" || sb.Timeout <= 0 {
		t.Fatalf("create --json: exit %d, %q %s", code, out, errOut)
	}

	out, _, code = cli("ls")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "ID ") || !strings.HasPrefix(lines[1], sb.SandboxID+" ") || !strings.Contains(lines[1], " running ") {
		t.Fatalf("ls: exit %d:\n%s", code, out)
	}

	out, errOut, code = cli("exec", sb.SandboxID, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if code != 3 || out != "out\n" || !strings.HasPrefix(errOut, "err\n") {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q; want 3, out, err", code, out, errOut)
	}

	out, _, code = cli("exec", "--json", sb.SandboxID, "--", "sh", "-c", "echo hi")
	var ex map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &ex) != nil || ex["stdout"] != "hi\n" || ex["exitCode"] != 0.0 || ex["status"] != "success" {
		t.Fatalf("exec --json: exit %d:\n%s", code, out)
	}
	// The keys come sorted, as the CLI has always printed them.
	if !strings.HasPrefix(out, "{\n  \"durationMs\": ") {
		t.Errorf("exec --json prints keys out of order:\n%s", out)
	}

	out, _, code = cli("stop", "--json", sb.SandboxID)
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.SandboxStatus != "stopped" {
		t.Fatalf("stop --json: exit %d:\n%s", code, out)
	}

	_, errOut, code = cli("stop", "sbx_unknown")
	if code != 1 || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("stop of an unknown sandbox: exit %d, stderr %q; want 1 and HTTP 404", code, errOut)
	}

	// upload streams a multipart form through the generated client's
	// WithBody call (the document gives the route's JSON body only): the
	// server commits the file where --path says.
	local := filepath.Join(t.TempDir(), "note.txt")
	if err := os.WriteFile(local, []byte("from the CLI\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = cli("upload", "--path", "inputs", local)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[1], "inputs/note.txt ") {
		t.Fatalf("upload: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if r := s.as(k, "GET", "/api/sandboxes/file?path=inputs/note.txt", nil); r.Status != 200 || r.Body["content"] != "from the CLI\n" {
		t.Fatalf("the uploaded file: %d %s", r.Status, r.Raw)
	}
}
