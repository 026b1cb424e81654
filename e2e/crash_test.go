package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestCrashRecovery kills the server with SIGKILL while runs execute and
// checks the reconcile rules at the next start: a run whose command still
// runs in its sandbox is followed again and ends COMPLETED with all of its
// output (the part printed while the server was down too), a run whose
// sandbox is gone is CRASHED, live sandboxes with rows are re-attached and
// usable, a sandbox process whose row is no longer active is destroyed,
// and a queued run acknowledged before the crash still runs.
func TestCrashRecovery(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, dsn string) {
		s := startServer(t, dsn, "--keep-sandboxes=true")
		a := s.createAccount("crash", false)
		k := s.createKey(a.ID)

		// 20 lines, one a second: the server dies after the first few.
		const lines = `i=1; while [ $i -le 20 ]; do echo line $i; i=$((i+1)); sleep 1; done`
		busy := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", lines}})
		idle := s.createSandbox(k, map[string]any{})
		orphan := s.createSandbox(k, map[string]any{"command": "sleep", "args": []string{"300"}})
		waitStatus(t, s, k, busy["runId"].(string), "EXECUTING")
		waitStatus(t, s, k, orphan["runId"].(string), "EXECUTING")
		time.Sleep(3 * time.Second)

		if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = s.cmd.Wait()

		// While the server is down: the orphan's row stops being active (as
		// if a stop was recorded but never carried out), and a run is queued
		// in the database with no one to work it yet.
		ctx := context.Background()
		st := storetest.Open(t, dsn)
		if ok, err := st.TransitionSandbox(ctx, orphan["sandboxId"].(string), []store.SandboxStatus{store.SandboxRunning}, store.SandboxFailed, "test", time.Now()); err != nil || !ok {
			t.Fatalf("mark orphan: %v %v", ok, err)
		}
		queued := enqueueRun(t, st, s, a.ID, idle["sandboxId"].(string), "echo", "queued")
		st.Close()
		if !s.runtimeHas(orphan["sandboxId"].(string)) {
			t.Fatal("orphan sandbox vanished with the server")
		}

		time.Sleep(2 * time.Second) // lines printed while no server runs
		s2 := restartServer(t, s)
		var want strings.Builder
		for i := 1; i <= 20; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		if r := s2.waitRun(k, busy["runId"].(string), time.Minute); r.Status != "COMPLETED" || r.Output["stdout"] != want.String() || r.Output["exitCode"] != 0.0 {
			t.Fatalf("run executing at the crash: %s, output %v", r.Status, r.Output)
		}
		if r := s2.waitRun(k, orphan["runId"].(string), 30*time.Second); r.Status != "CRASHED" {
			t.Fatalf("run whose sandbox went away during the outage is %s", r.Status)
		}
		for _, sb := range []map[string]any{busy, idle} {
			id := sb["sandboxId"].(string)
			if status, _ := s2.sandboxStatus(k, id); status != "running" {
				t.Fatalf("sandbox %s is %s after restart", id, status)
			}
			r := s2.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "echo", "args": []string{"alive"}})
			if r.Status != 200 || r.Body["stdout"] != "alive\n" {
				t.Fatalf("exec after restart in %s: %d %s", id, r.Status, r.Raw)
			}
		}
		if r := s2.waitRun(k, queued, time.Minute); r.Status != "COMPLETED" || r.Output["stdout"] != "queued\n" {
			t.Fatalf("run queued during the outage: %+v", r)
		}
		if s2.runtimeHas(orphan["sandboxId"].(string)) {
			t.Fatal("sandbox process without an active row survived the restart")
		}
		// New work goes on as usual.
		sb := s2.createSandbox(k, map[string]any{"command": "echo", "args": []string{"after"}})
		if r := s2.waitRun(k, sb["runId"].(string), time.Minute); r.Status != "COMPLETED" || r.Output["stdout"] != "after\n" {
			t.Fatalf("run after restart: %+v", r)
		}
		s2.stopAll(k)
	})
}

// enqueueRun records a run and its job the way the server does (one
// transaction, on the sandbox's node queue) while no server is running.
func enqueueRun(t *testing.T, st *store.Store, s *server, accountID, sandboxID string, command string, args ...string) string {
	t.Helper()
	ctx := context.Background()
	nodeID, err := os.ReadFile(filepath.Join(s.dataDir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jobs.New(ctx, st, jobs.Config{PostgresDSN: s.dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer jc.Close()
	payload, _ := json.Marshal(map[string]any{"command": command, "args": args, "sandboxId": sandboxID, "accountId": accountID})
	run := store.Run{AccountID: accountID, SandboxID: sandboxID, Task: jobs.KindRunCommand, Payload: payload}
	err = st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		if err := q.CreateRun(ctx, &run); err != nil {
			return err
		}
		return jc.InsertTx(ctx, tx, jobs.RunCommandArgs{RunID: run.ID}, strings.TrimSpace(string(nodeID)))
	})
	if err != nil {
		t.Fatal(err)
	}
	return run.ID
}

// waitStatus polls a run until it has the status.
func waitStatus(t *testing.T, s *server, k key, runID, status string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		r := s.as(k, "GET", "/api/tasks/runs?runId="+runID, nil)
		if r.Status == 200 && r.Body["runs"].([]any)[0].(map[string]any)["status"] == status {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("run %s never reached %s", runID, status)
}

// restartServer starts a new server on the data dir and database of s.
func restartServer(t *testing.T, s *server) *server {
	t.Helper()
	return startServerIn(t, s.dataDir, s.dsn)
}

// stopAll stops every sandbox of the key's account through the API.
func (s *server) stopAll(k key) {
	s.t.Helper()
	r := s.as(k, "GET", "/api/sandboxes", nil)
	for _, v := range r.Body["sandboxes"].([]any) {
		sb := v.(map[string]any)
		if sb["sandboxStatus"] == "running" {
			s.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", nil)
		}
	}
}
