package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestNodeDown: when node "there" stops heartbeating, node "here" declares
// it down and fails what it hosted — its sandbox failed with the reason,
// its key revoked, its executing run CRASHED, its queued job moved to the
// shared queue — and when "there" comes back it destroys that sandbox
// instead of serving it again, keeps the one started since, and is up.
func TestNodeDown(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	jc, err := jobs.New(ctx, p.st, jobs.Config{NodeID: "there"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	thereRT := runtimefake.New()
	there := NewManager(Config{Store: p.st, Runtime: thereRT, Jobs: jc, NodeID: "there", DataDir: t.TempDir(),
		Settings: Settings{}, Hooks: []Hook{NewKeyHook(KeyHookConfig{Store: p.st})}, DownAfter: time.Second})
	if err := there.register(ctx); err != nil {
		t.Fatal(err)
	}
	lost, _, err := there.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := thereRT.Spec(lost.ID)
	var key string
	for _, kv := range spec.Env {
		if k, ok := strings.CutPrefix(kv, "RECOUP_API_KEY="); ok {
			key = k
		}
	}
	if _, err := p.auth.Authenticate(ctx, key); err != nil {
		t.Fatalf("the sandbox's key before: %v", err)
	}
	run := store.Run{AccountID: p.account.ID, SandboxID: lost.ID, Task: jobs.KindRunCommand, Payload: json.RawMessage(`{"command":"sleep"}`)}
	if err := p.st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.st.StartRun(ctx, run.ID, time.Now()); err != nil || !ok {
		t.Fatalf("start run: %v %v", ok, err)
	}
	if err := jc.Insert(ctx, jobs.StopSandboxArgs{SandboxID: lost.ID, Reason: "test"}, "there"); err != nil {
		t.Fatal(err)
	}

	// "there" falls silent; "here" watches with a one-second limit.
	if err := p.st.HeartbeatNode(ctx, "there", time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	p.m.cfg.DownAfter = time.Second
	if err := p.m.register(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	go p.m.watchNodes(wctx)
	deadline := time.Now().Add(5 * time.Second)
	for p.status(t, lost.ID).Status != store.SandboxFailed {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox of the silent node was not failed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	// The user is told what happened, not the node's id.
	if sb := p.status(t, lost.ID); !strings.HasPrefix(sb.FailureReason, "its node stopped answering") || strings.Contains(sb.FailureReason, "there") {
		t.Errorf("reason %q", sb.FailureReason)
	}
	if r, _ := p.st.GetRun(ctx, run.ID); r.Status != store.RunCrashed {
		t.Errorf("its run is %s, want CRASHED", r.Status)
	}
	if _, err := p.auth.Authenticate(ctx, key); err == nil {
		t.Error("the lost sandbox's key still works")
	}
	if n, _ := p.st.GetNode(ctx, "there"); n.Status != store.NodeDown {
		t.Errorf("node there is %s", n.Status)
	}
	// A cordoned node leaves tasks' jobs to the others.
	if !p.m.TakesSandboxes(ctx) {
		t.Error("node here takes no sandboxes before it is cordoned")
	}
	if err := p.st.SetNodeSchedule(ctx, "here", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	if p.m.TakesSandboxes(ctx) {
		t.Error("a cordoned node takes tasks' sandboxes")
	}
	if err := p.st.SetNodeSchedule(ctx, "here", ""); err != nil {
		t.Fatal(err)
	}
	var queue string
	if err := p.st.DB().QueryRowContext(ctx, "SELECT queue FROM river_job WHERE kind = ?", jobs.KindStopSandbox).Scan(&queue); err != nil || queue != "default" {
		t.Errorf("the down node's job is on queue %q (%v), want default", queue, err)
	}

	// "there" comes back: it learns it was down, destroys the lost
	// sandbox, keeps one started since, and is up.
	kept, _, err := there.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.st.HeartbeatNode(ctx, "there", time.Now()); !errors.Is(err, store.ErrNodeDown) {
		t.Fatalf("heartbeat of a down node: %v", err)
	}
	if err := there.rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := thereRT.Get(ctx, lost.ID); err == nil {
		t.Error("the lost sandbox still exists on its node after it rejoined")
	}
	if _, err := thereRT.Get(ctx, kept.ID); err != nil {
		t.Errorf("the sandbox started since was destroyed: %v", err)
	}
	if n, _ := p.st.GetNode(ctx, "there"); n.Status != store.NodeUp {
		t.Errorf("node there after rejoining: %s", n.Status)
	}
	if sb := p.status(t, lost.ID); sb.Status != store.SandboxFailed {
		t.Errorf("the lost sandbox was resurrected: %s", sb.Status)
	}
}

// TestJudgeAfterOutage: a node judges the others only once its own
// heartbeats have gone through for DownAfter: after the database comes
// back from an outage, everyone's heartbeat is old, and nobody may be
// declared down before they could write one.
func TestJudgeAfterOutage(t *testing.T) {
	p := newPlane(t, Settings{})
	now := time.Now()
	p.m.now = func() time.Time { return now }
	p.m.cfg.DownAfter = 30 * time.Second
	if p.m.mayJudgeNodes() {
		t.Fatal("judges before its first heartbeat")
	}
	p.m.heartbeatDone(true)
	now = now.Add(31 * time.Second)
	p.m.heartbeatDone(true)
	if !p.m.mayJudgeNodes() {
		t.Fatal("does not judge after beating for DownAfter")
	}
	p.m.heartbeatDone(false) // the database went away
	now = now.Add(time.Minute)
	p.m.heartbeatDone(true) // and came back
	if p.m.mayJudgeNodes() {
		t.Fatal("judges the others right after an outage")
	}
	now = now.Add(31 * time.Second)
	if !p.m.mayJudgeNodes() {
		t.Fatal("does not judge DownAfter after the outage")
	}
}
