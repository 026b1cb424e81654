package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/kernel"
)

// The tests of this file replay what the original platform's own clients
// expect (its published OpenAPI documents for the sandbox and task-run
// routes, its command-line client, its web clients and its task runner's
// result schemas), written against the published shapes: field names and
// JSON types as the original's spec gives them.

// publishedRunStatuses is the published TaskRunResponse.status enum, as far
// as the original's web clients know the values (anything else they poll
// forever and show as "Unknown").
var publishedRunStatuses = []string{"QUEUED", "EXECUTING", "COMPLETED", "FAILED", "CRASHED", "CANCELED", "SYSTEM_FAILURE", "INTERRUPTED"}

// terminalRunStatuses are the statuses the web clients stop polling at.
var terminalRunStatuses = []string{"COMPLETED", "FAILED", "CRASHED", "CANCELED", "SYSTEM_FAILURE", "INTERRUPTED"}

// rawRun fetches a run as the clients see it: the JSON object itself.
func (s *server) rawRun(k key, runID string) map[string]any {
	s.t.Helper()
	r := s.as(k, "GET", "/api/tasks/runs?runId="+runID, nil)
	if r.Status != 200 {
		s.t.Fatalf("get run %s: %d %s", runID, r.Status, r.Raw)
	}
	v := r.Body["runs"].([]any)[0].(map[string]any)
	checkRunShape(s.t, v)
	return v
}

// checkRunShape asserts the published TaskRunResponse types of a run.
func checkRunShape(t *testing.T, v map[string]any) {
	t.Helper()
	status, _ := v["status"].(string)
	if !slices.Contains(publishedRunStatuses, status) {
		t.Fatalf("run status %q is not in the published enum %v", status, publishedRunStatuses)
	}
	if _, ok := v["durationMs"].(float64); !ok {
		t.Fatalf("durationMs is %T (%v), the published schema types it as a number", v["durationMs"], v["durationMs"])
	}
	for _, f := range []string{"isCompleted", "isSuccess", "isFailed"} {
		if _, ok := v[f].(bool); !ok {
			t.Fatalf("%s is %T", f, v[f])
		}
	}
	if slices.Contains(terminalRunStatuses, status) != (v["isCompleted"] == true) {
		t.Fatalf("status %s with isCompleted %v", status, v["isCompleted"])
	}
}

// waitRawRun polls a run until the web clients would stop polling it.
func (s *server) waitRawRun(k key, runID string, timeout time.Duration) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := s.rawRun(k, runID)
		if slices.Contains(terminalRunStatuses, v["status"].(string)) {
			return v
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("run %s still %s after %s", runID, v["status"], timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClients(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, dsn string) {
		s := startServer(t, dsn)
		alice := s.createAccount("alice", false)
		ak := s.createKey(alice.ID)
		bob := s.createAccount("bob", false)
		bk := s.createKey(bob.ID)

		// One command run gives alice a snapshot the later cases use.
		first := s.createSandbox(ak, map[string]any{"command": "sh", "args": []string{"-c", "echo out; echo err >&2; echo kept > kept.txt"}})
		done := s.waitRawRun(ak, first["runId"].(string), 60*time.Second)
		if done["status"] != "COMPLETED" {
			t.Fatalf("first run: %v", done)
		}

		t.Run("PATCH answers the raw row, or null without a snapshot", func(t *testing.T) {
			// bob has no row: PATCH {} is null, and so is a row that has a
			// repository but no snapshot (snapshot_id is typed string).
			for _, body := range []any{map[string]any{}, map[string]any{"github_repo": "https://git.example.test/bob.git"}} {
				r := s.as(bk, "PATCH", "/api/sandboxes", body)
				if r.Status != 200 || strings.TrimSpace(string(r.Raw)) != "null" {
					t.Fatalf("PATCH %v for an account without a snapshot: %d %s, want 200 null", body, r.Status, r.Raw)
				}
			}
			snapID := done["output"].(map[string]any)["snapshot"].(map[string]any)["id"].(string)
			for _, body := range []any{map[string]any{"snapshotId": snapID}, map[string]any{}} {
				r := s.as(ak, "PATCH", "/api/sandboxes", body)
				if r.Status != 200 {
					t.Fatalf("PATCH %v: %d %s", body, r.Status, r.Raw)
				}
				checkSnapshotRow(t, r.Body, alice.ID, snapID)
			}
		})

		t.Run("an unknown sandbox_id lists nothing, with the account's environment", func(t *testing.T) {
			own := s.as(ak, "GET", "/api/sandboxes", nil)
			for _, id := range []string{"sbx_unknown", first["sandboxId"].(string)} {
				k := ak
				if id != "sbx_unknown" {
					k = bk // alice's sandbox is unknown to bob
				}
				r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil)
				if r.Status != 200 || r.Body["status"] != "success" {
					t.Fatalf("sandbox_id=%s: %d %s, want 200", id, r.Status, r.Raw)
				}
				if sbs, ok := r.Body["sandboxes"].([]any); !ok || len(sbs) != 0 {
					t.Fatalf("sandbox_id=%s: sandboxes %v, want []", id, r.Body["sandboxes"])
				}
				for _, f := range []string{"snapshot_id", "github_repo", "filetree"} {
					if _, ok := r.Body[f]; !ok {
						t.Fatalf("sandbox_id=%s: no %s in %s", id, f, r.Raw)
					}
				}
			}
			r := s.as(ak, "GET", "/api/sandboxes?sandbox_id=sbx_unknown", nil)
			if r.Body["snapshot_id"] != own.Body["snapshot_id"] || r.Body["github_repo"] != own.Body["github_repo"] || len(r.Body["filetree"].([]any)) != len(own.Body["filetree"].([]any)) {
				t.Fatalf("filtered list lost the account's environment:\n%s\nunfiltered:\n%s", r.Raw, own.Raw)
			}
		})

		t.Run("a run cut by the sandbox's deadline is FAILED and keeps its output", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"timeout": 3000, "command": "sh", "args": []string{"-c", "echo before; sleep 60"}})
			v := s.waitRawRun(ak, sb["runId"].(string), 60*time.Second)
			if v["status"] != "FAILED" || v["isFailed"] != true || v["isSuccess"] != false {
				t.Fatalf("run cut by the timeout: %v", v)
			}
			msg, _ := v["error"].(map[string]any)["message"].(string)
			if !strings.Contains(msg, "reached its timeout after 3s") {
				t.Fatalf("error.message %q does not say the sandbox reached its timeout and after how long", msg)
			}
			out, _ := v["output"].(map[string]any)
			if !strings.Contains(out["stdout"].(string), "before") {
				t.Fatalf("the partial output is lost: %v", out)
			}
		})

		t.Run("POST /api/sandboxes/setup starts setup-sandbox once", func(t *testing.T) {
			carol := s.createAccount("carol", false)
			ck := s.createKey(carol.ID)
			r := s.as(ck, "POST", "/api/sandboxes/setup", nil)
			if r.Status != 200 || r.Body["status"] != "success" {
				t.Fatalf("setup: %d %s", r.Status, r.Raw)
			}
			runID, _ := r.Body["runId"].(string)
			if !strings.HasPrefix(runID, "run_") || len(r.Body) != 2 {
				t.Fatalf("setup answer %s, want the published SetupSandboxResponse", r.Raw)
			}
			again := s.as(ck, "POST", "/api/sandboxes/setup", map[string]any{"account_id": carol.ID})
			if again.Status != 200 {
				t.Fatalf("second setup: %d %s", again.Status, again.Raw)
			}
			if id := again.Body["runId"].(string); id != runID {
				// Only allowed if the first had ended by then.
				if v := s.rawRun(ck, runID); v["isCompleted"] != true {
					t.Fatalf("a setup while %s runs started %s", runID, id)
				}
			}
			list := s.as(ck, "GET", "/api/tasks/runs", nil)
			found := false
			for _, x := range list.Body["runs"].([]any) {
				v := x.(map[string]any)
				checkRunShape(t, v)
				found = found || (v["id"] == runID && v["taskIdentifier"] == "setup-sandbox")
			}
			if !found {
				t.Fatalf("setup run %s not in the account's runs: %s", runID, list.Raw)
			}
			// It runs to an end the clients know (the busybox test image has
			// no git, so here it fails; TestAgents sees it complete).
			if v := s.waitRawRun(ck, runID, 2*time.Minute); v["startedAt"] == nil {
				t.Fatalf("setup run never started: %v", v)
			}
			// The same rules as every route.
			for _, tc := range []struct {
				name   string
				k      key
				body   any
				status int
				msg    string
			}{
				{"another account", ck, map[string]any{"account_id": alice.ID}, 403, "Access denied to specified account_id"},
				{"bad account_id", ck, map[string]any{"account_id": "nope"}, 400, "account_id must be a valid UUID"},
				{"malformed JSON", ck, `{nope`, 400, "Request body must be valid JSON"},
			} {
				r := s.as(tc.k, "POST", "/api/sandboxes/setup", tc.body)
				if r.Status != tc.status || r.Body["error"] != tc.msg {
					t.Errorf("%s: %d %s, want %d %q", tc.name, r.Status, r.Raw, tc.status, tc.msg)
				}
			}
			if r := s.call("POST", "/api/sandboxes/setup", nil, nil); r.Status != 401 {
				t.Errorf("no key: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("run output carries the snapshot as the task runner reads it", func(t *testing.T) {
			out := done["output"].(map[string]any)
			if out["stdout"] != "out\n" || out["stderr"] != "err\n" || out["exitCode"] != 0.0 {
				t.Fatalf("output %v", out)
			}
			snap, ok := out["snapshot"].(map[string]any)
			if !ok {
				t.Fatalf("no output.snapshot in %v", out)
			}
			id, _ := snap["id"].(string)
			exp, _ := snap["expiresAt"].(string)
			if _, err := time.Parse(time.RFC3339, exp); err != nil || !strings.HasPrefix(id, "snap_") || out["snapshotId"] != id {
				t.Fatalf("output.snapshot %v (snapshotId %v)", snap, out["snapshotId"])
			}
		})

		t.Run("durationMs is a number before, during and after the run", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"command": "sleep", "args": []string{"2"}})
			runID := sb["runId"].(string)
			seen := map[string]bool{}
			deadline := time.Now().Add(60 * time.Second)
			for {
				v := s.rawRun(ak, runID) // checks durationMs is a number
				seen[v["status"].(string)] = true
				if v["isCompleted"] == true {
					if d := v["durationMs"].(float64); d < 1500 {
						t.Fatalf("durationMs %v for a 2 s command", d)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("run %s never finished", runID)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !seen["EXECUTING"] {
				t.Logf("statuses seen: %v (EXECUTING was not caught)", seen)
			}
		})

		t.Run("a prompt on an image without opencode is refused at once", func(t *testing.T) {
			// The test image is busybox: no agent CLIs.
			r := s.as(ak, "POST", "/api/sandboxes", map[string]any{"prompt": "hello"})
			msg, _ := r.Body["error"].(string)
			if r.Status != 400 || !strings.Contains(msg, "opencode") || !strings.Contains(msg, "--template full") {
				t.Fatalf("prompt without opencode: %d %s, want 400 naming opencode and --template full", r.Status, r.Raw)
			}
			r = s.as(ak, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": "https://git.example.test/r.git", "prompt": "fix it"})
			msg, _ = r.Body["error"].(string)
			if r.Status != 400 || !strings.Contains(msg, "claude") || !strings.Contains(msg, "--template full") {
				t.Fatalf("coding agent without claude: %d %s, want 400 naming claude and --template full", r.Status, r.Raw)
			}
			// Nothing was started for either.
			list := s.as(ak, "GET", "/api/tasks/runs?limit=100", nil)
			for _, x := range list.Body["runs"].([]any) {
				v := x.(map[string]any)
				if v["taskIdentifier"] == "coding-agent" || strings.Contains(string(mustJSON(t, v["payload"])), "opencode") {
					t.Fatalf("a refused request left a run: %v", v)
				}
			}
		})
	})
}

// checkSnapshotRow asserts the published UpdateSnapshotResponse: the row
// itself, with string fields, and nothing wrapped around it.
func checkSnapshotRow(t *testing.T, row map[string]any, accountID, snapshotID string) {
	t.Helper()
	want := []string{"account_id", "created_at", "expires_at", "github_repo", "snapshot_id"}
	var got []string
	for k := range row {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("row fields %v, want %v", got, want)
	}
	if row["account_id"] != accountID || row["snapshot_id"] != snapshotID {
		t.Fatalf("row %v", row)
	}
	for _, f := range []string{"expires_at", "created_at"} {
		if v, ok := row[f].(string); !ok {
			t.Fatalf("%s is %T", f, row[f])
		} else if _, err := time.Parse(time.RFC3339, v); err != nil {
			t.Fatalf("%s %q: %v", f, v, err)
		}
	}
}

// TestMicroVMKernelOnServe: `serve --runtime microvm` on a machine without a
// built kernel builds it, with the progress of `sandboxd kernel build` (the
// same function writing to the same stream); where the build tools are
// missing it exits with the one command that installs them. The whole build
// takes 10+ minutes, so the build case stops serve once the build has
// started: `sandboxd kernel build` in make test runs one to its end.
func TestMicroVMKernelOnServe(t *testing.T) {
	t.Run("without the build tools it exits with the install command", func(t *testing.T) {
		emptyPath := t.TempDir() // a PATH with none of the build tools
		cmd := microVMServe(t, append(os.Environ(), "PATH="+emptyPath))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("serve without a kernel or build tools exited 0:\n%s", out.String())
			}
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("serve did not exit:\n%s", out.String())
		}
		if !strings.Contains(out.String(), kernel.InstallCommand) {
			t.Fatalf("serve's error does not give the install command %q:\n%s", kernel.InstallCommand, out.String())
		}
	})

	t.Run("with the build tools it builds the kernel", func(t *testing.T) {
		sources, _ := filepath.Glob("/usr/src/linux-source-*.tar.xz")
		if len(sources) == 0 {
			if os.Getenv("SANDBOXD_REQUIRE_MICROVM") == "1" {
				t.Fatal("no /usr/src/linux-source-*.tar.xz (SANDBOXD_REQUIRE_MICROVM=1; scripts/install-deps.sh installs it)")
			}
			t.Skip("no kernel source to build from: " + kernel.InstallCommand)
		}
		cmd := microVMServe(t, os.Environ()) // an empty --cache-dir: no kernel
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Stopped with SIGINT, serve cancels the build (make's process group
		// is killed) before the test's temporary directories are removed.
		defer func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}()
		// The build's progress: serve's stderr is not a terminal here, so
		// it is log lines (internal/progress), the first when the build
		// starts: msg="building guest kernel 6.1-sandboxd-<key>" ... done=0.
		want := regexp.MustCompile(`building guest kernel [0-9.]+` + regexp.QuoteMeta(kernel.LocalVersion) + `-[0-9a-f]+.* done=0 total=\d+`)
		deadline := time.After(2 * time.Minute)
		for !want.MatchString(out.String()) {
			select {
			case err := <-done:
				done <- err // for the deferred wait
				t.Fatalf("serve exited (%v) instead of building the kernel:\n%s", err, out.String())
			case <-deadline:
				t.Fatalf("no build progress (%s) in serve's output after 2 minutes:\n%s", want, out.String())
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// microVMServe is `sandboxd serve --runtime microvm` with an empty cache dir
// (no kernel) and the environment env.
func microVMServe(t *testing.T, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(binary, "serve", "--runtime", "microvm", "--listen", freeAddr(t),
		"--data-dir", t.TempDir(), "--cache-dir", t.TempDir(), "--rootfs", rootfs, "--keep-sandboxes=false")
	cmd.Env = env
	return cmd
}

// syncBuffer is a bytes.Buffer that a command writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
