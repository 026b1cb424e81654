package membership

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// node is one node of a test cluster: its sandboxes (a real Manager over
// the fake runtime) and its membership.
type node struct {
	m   *Membership
	mgr *sandbox.Manager
	rt  *runtimefake.Runtime
	jc  *jobs.Client
}

func newNode(t *testing.T, st *store.Store, id string, downAfter time.Duration) *node {
	t.Helper()
	jc, err := jobs.New(context.Background(), st, jobs.Config{NodeID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	rt := runtimefake.New()
	mgr := sandbox.NewManager(sandbox.Config{Store: st, Runtime: rt, Jobs: jc, NodeID: id, DataDir: t.TempDir(),
		Hooks: []sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{Store: st})}})
	m := New(Config{Store: st, NodeID: id, DownAfter: downAfter, Sandboxes: mgr, Jobs: jc})
	return &node{m: m, mgr: mgr, rt: rt, jc: jc}
}

func status(t *testing.T, st *store.Store, id string) store.Sandbox {
	t.Helper()
	sb, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestNodeDown: when node "there" stops heartbeating, node "here" declares
// it down and fails what it hosted — its sandbox failed with the reason,
// its key revoked, its executing run CRASHED, its queued job moved to the
// shared queue — and when "there" comes back it destroys that sandbox
// instead of serving it again, keeps the one started since, and is up.
func TestNodeDown(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	acct := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		t.Fatal(err)
	}
	authn := auth.NewAuthenticator(st)
	here := newNode(t, st, "here", 0)
	there := newNode(t, st, "there", time.Second)
	thereRT := there.rt
	if err := there.m.Register(ctx); err != nil {
		t.Fatal(err)
	}
	lost, _, err := there.mgr.Create(ctx, acct.ID, sandbox.CreateRequest{})
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
	if _, err := authn.Authenticate(ctx, key); err != nil {
		t.Fatalf("the sandbox's key before: %v", err)
	}
	run := store.Run{AccountID: acct.ID, SandboxID: lost.ID, Task: jobs.KindRunCommand, Payload: json.RawMessage(`{"command":"sleep"}`)}
	if err := st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.StartRun(ctx, run.ID, time.Now()); err != nil || !ok {
		t.Fatalf("start run: %v %v", ok, err)
	}
	if err := there.jc.Insert(ctx, jobs.StopSandboxArgs{SandboxID: lost.ID, Reason: "test"}, "there"); err != nil {
		t.Fatal(err)
	}

	// "there" falls silent; "here" watches with a one-second limit.
	if err := st.HeartbeatNode(ctx, "there", time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	here.m.cfg.DownAfter = time.Second
	builds := &adoptedBuilds{}
	here.m.cfg.Builds = builds
	if err := here.m.Register(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	go here.m.watchNodes(wctx)
	deadline := time.Now().Add(5 * time.Second)
	for status(t, st, lost.ID).Status != store.SandboxFailed {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox of the silent node was not failed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	// The user is told what happened, not the node's id.
	if sb := status(t, st, lost.ID); !strings.HasPrefix(sb.FailureReason, "its node stopped answering") || strings.Contains(sb.FailureReason, "there") {
		t.Errorf("reason %q", sb.FailureReason)
	}
	if r, _ := st.GetRun(ctx, run.ID); r.Status != store.RunCrashed {
		t.Errorf("its run is %s, want CRASHED", r.Status)
	}
	if _, err := authn.Authenticate(ctx, key); err == nil {
		t.Error("the lost sandbox's key still works")
	}
	if n, _ := st.GetNode(ctx, "there"); n.Status != store.NodeDown {
		t.Errorf("node there is %s", n.Status)
	}
	if got := builds.nodes(); len(got) != 1 || got[0] != "there" {
		t.Errorf("template builds taken over from %v, want [there]", got)
	}
	// A cordoned node leaves tasks' jobs to the others.
	if !here.m.TakesSandboxes(ctx) {
		t.Error("node here takes no sandboxes before it is cordoned")
	}
	if err := st.SetNodeSchedule(ctx, "here", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	if here.m.TakesSandboxes(ctx) {
		t.Error("a cordoned node takes tasks' sandboxes")
	}
	if err := st.SetNodeSchedule(ctx, "here", ""); err != nil {
		t.Fatal(err)
	}
	var queue string
	if err := st.DB().QueryRowContext(ctx, "SELECT queue FROM river_job WHERE kind = ?", jobs.KindStopSandbox).Scan(&queue); err != nil || queue != "default" {
		t.Errorf("the down node's job is on queue %q (%v), want default", queue, err)
	}

	// "there" comes back: it learns it was down, destroys the lost
	// sandbox, keeps one started since, and is up.
	kept, _, err := there.mgr.Create(ctx, acct.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.HeartbeatNode(ctx, "there", time.Now()); !errors.Is(err, store.ErrNodeDown) {
		t.Fatalf("heartbeat of a down node: %v", err)
	}
	if err := there.m.rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := thereRT.Get(ctx, lost.ID); err == nil {
		t.Error("the lost sandbox still exists on its node after it rejoined")
	}
	if _, err := thereRT.Get(ctx, kept.ID); err != nil {
		t.Errorf("the sandbox started since was destroyed: %v", err)
	}
	if n, _ := st.GetNode(ctx, "there"); n.Status != store.NodeUp {
		t.Errorf("node there after rejoining: %s", n.Status)
	}
	if sb := status(t, st, lost.ID); sb.Status != store.SandboxFailed {
		t.Errorf("the lost sandbox was resurrected: %s", sb.Status)
	}
}

// TestJudgeAfterOutage: a node judges the others only once its own
// heartbeats have gone through for DownAfter: after the database comes
// back from an outage, everyone's heartbeat is old, and nobody may be
// declared down before they could write one.
func TestJudgeAfterOutage(t *testing.T) {
	m := New(Config{})
	now := time.Now()
	m.now = func() time.Time { return now }
	m.cfg.DownAfter = 30 * time.Second
	if m.mayJudgeNodes() {
		t.Fatal("judges before its first heartbeat")
	}
	m.heartbeatDone(true)
	now = now.Add(31 * time.Second)
	m.heartbeatDone(true)
	if !m.mayJudgeNodes() {
		t.Fatal("does not judge after beating for DownAfter")
	}
	m.heartbeatDone(false) // the database went away
	now = now.Add(time.Minute)
	m.heartbeatDone(true) // and came back
	if m.mayJudgeNodes() {
		t.Fatal("judges the others right after an outage")
	}
	now = now.Add(31 * time.Second)
	if !m.mayJudgeNodes() {
		t.Fatal("does not judge DownAfter after the outage")
	}
}

// adoptedBuilds records the nodes whose template builds were taken over.
type adoptedBuilds struct {
	mu  sync.Mutex
	ids []string
}

func (a *adoptedBuilds) AdoptBuilds(_ context.Context, nodeID string) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids = append(a.ids, nodeID)
	return 0, nil
}

func (a *adoptedBuilds) nodes() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.ids...)
}
