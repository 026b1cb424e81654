package sandbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// lostRuntime is a host whose runtime has lost every sandbox (its processes
// died with the machine, say): what Live and Reconcile must notice. It is
// a stand-in for the state of a real backend after such a loss, not a fake
// of its behaviour: nothing is ever created on it.
type lostRuntime struct{}

func (lostRuntime) Name() string { return "gvisor" }
func (lostRuntime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Network: true}
}
func (lostRuntime) Create(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return nil, errors.New("this host cannot create sandboxes")
}
func (lostRuntime) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	return nil, fmt.Errorf("get %s: %w", id, runtime.ErrNotFound)
}
func (lostRuntime) List(context.Context) ([]string, error) { return nil, nil }
func (lostRuntime) Close() error                           { return nil }

// TestSandboxKeysRevokedOnEveryEnd ends a sandbox on each path of the
// manager and checks that its key no longer authenticates.
func TestSandboxKeysRevokedOnEveryEnd(t *testing.T) {
	securitytest.Attack(t, "keys",
		"code keeps its sandbox's RECOUP_API_KEY after the sandbox vanished from the runtime (found by a list or by reconcile), was stopped on another node, or its environment was deleted",
		"every one of those paths revokes the key at once: it no longer authenticates")
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jc.Close() })
	acct := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		t.Fatal(err)
	}
	m := NewManager(Config{Store: st, Runtime: lostRuntime{}, Jobs: jc, NodeID: "here", Hooks: []Hook{NewKeyHook(KeyHookConfig{Store: st})}})
	a := auth.NewAuthenticator(st)

	// sandbox records a sandbox on node in status with a key of its own.
	sandbox := func(node string, status store.SandboxStatus) (store.Sandbox, string) {
		sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: acct.ID, NodeID: node, Status: status, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		plaintext, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		k := store.APIKey{AccountID: acct.ID, Prefix: prefix, Hash: hash, SandboxID: sb.ID}
		if err := st.CreateAPIKey(ctx, &k); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Authenticate(ctx, plaintext); err != nil {
			t.Fatalf("a live sandbox's key: %v", err)
		}
		return sb, plaintext
	}
	cases := []struct {
		name   string
		node   string
		status store.SandboxStatus
		end    func(sb store.Sandbox)
		want   store.SandboxStatus // the sandbox's status afterwards
	}{
		{"vanished, seen by a list (Live)", "here", store.SandboxRunning, func(sb store.Sandbox) { m.Live(ctx, []store.Sandbox{sb}) }, store.SandboxFailed},
		{"vanished, seen by reconcile", "here", store.SandboxRunning, func(store.Sandbox) { _ = m.Reconcile(ctx) }, store.SandboxFailed},
		{"pending at a restart", "here", store.SandboxPending, func(store.Sandbox) { _ = m.Reconcile(ctx) }, store.SandboxFailed},
		{"stopped", "here", store.SandboxRunning, func(sb store.Sandbox) { _, _ = m.stopByRequest(ctx, sb) }, store.SandboxStopped},
		{"stopped on another node (before that node acts)", "elsewhere", store.SandboxRunning, func(sb store.Sandbox) { _, _ = m.stopByRequest(ctx, sb) }, store.SandboxStopping},
		{"environment deleted", "elsewhere", store.SandboxRunning, func(store.Sandbox) { _, _ = m.DeleteEnvironment(ctx, acct.ID) }, store.SandboxStopping},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb, key := sandbox(tc.node, tc.status)
			tc.end(sb)
			if _, err := a.Authenticate(ctx, key); !errors.Is(err, auth.ErrUnauthorized) {
				t.Fatalf("the key still authenticates: %v", err)
			}
			got, err := st.GetSandbox(ctx, sb.ID)
			if err != nil || got.Status != tc.want {
				t.Fatalf("sandbox is %s (%v), want %s", got.Status, err, tc.want)
			}
		})
	}
}
