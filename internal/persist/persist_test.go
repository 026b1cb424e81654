package persist

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// These tests run the snapshot chain — capture, flatten past MaxDepth,
// restore and garbage collection — over a real SQLite store, the real local
// blob store and the real layer format, with the sandboxes of package
// runtimefake (whose Snapshot writes its in-memory files as a real layer):
// no root-only runtime needed.

type chainFixture struct {
	svc     *Service
	st      *store.Store
	blobs   blob.Store
	rt      *runtimefake.Runtime
	account store.Account

	mu  sync.Mutex
	now time.Time
}

func newChainFixture(t *testing.T, opts Options) *chainFixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	blobs, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	repos, err := repo.New(repo.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f := &chainFixture{st: st, blobs: blobs, rt: runtimefake.New(), now: time.Now()}
	opts.Store, opts.Blobs, opts.Repos = st, blobs, repos
	opts.BaseDir, opts.TempDir = t.TempDir(), t.TempDir()
	opts.Now = f.clock
	if f.svc, err = New(opts); err != nil {
		t.Fatal(err)
	}
	f.account = store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &f.account); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *chainFixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *chainFixture) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// capture runs one sandbox of the account from its current snapshot,
// writes files into it and captures it, as a run's end does.
func (f *chainFixture) capture(t *testing.T, files map[string]string) (store.Snapshot, error) {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: fmt.Sprintf("sbx_%d", time.Now().UnixNano()), AccountID: f.account.ID, NodeID: "here", Status: store.SandboxRunning, Runtime: "fake", Deadline: time.Now().Add(time.Hour)}
	if env, err := f.st.GetEnvironment(ctx, f.account.ID); err == nil && env.SnapshotID != nil {
		sb.SnapshotID = *env.SnapshotID
	}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	rsb := f.rt.Add(sb.ID)
	for p, content := range files {
		if err := rsb.WriteFile(ctx, p, strings.NewReader(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := f.svc.Capture(ctx, sb, rsb)
	// The run is over and the sandbox with it: it no longer holds the
	// snapshot it started from.
	if _, terr := f.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "test", time.Now()); terr != nil {
		t.Fatal(terr)
	}
	return snap, err
}

// restored applies the account's chain, bottom first, into one directory:
// what a sandbox started from the snapshot sees of its writable layers.
func (f *chainFixture) restored(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	layers, _, release, err := f.svc.Layers(ctx, f.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	dir := t.TempDir()
	for _, l := range layers {
		if _, err := snapshot.Apply(ctx, l.R, dir, nil); err != nil {
			t.Fatalf("apply layer %s: %v", l.ID, err)
		}
	}
	return dir
}

func (f *chainFixture) storedBlobs(t *testing.T) []string {
	t.Helper()
	var keys []string
	if err := f.blobs.List(context.Background(), func(i blob.Info) error { keys = append(keys, i.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

func TestChainFlattensAndCollects(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 3})
	ctx := context.Background()
	var depths []int
	for gen := 1; gen <= 7; gen++ {
		snap, err := f.capture(t, map[string]string{
			"/workspace/state.txt":               fmt.Sprintf("generation %d", gen),
			fmt.Sprintf("/home/gen-%d.txt", gen): "kept",
		})
		if err != nil {
			t.Fatalf("capture %d: %v", gen, err)
		}
		depths = append(depths, snap.Depth)
		env, err := f.st.GetEnvironment(ctx, f.account.ID)
		if err != nil || env.SnapshotID == nil || *env.SnapshotID != snap.ID {
			t.Fatalf("capture %d: the environment does not point at it (%v)", gen, err)
		}
	}
	// Past MaxDepth the chain is flattened into one layer without parent.
	if fmt.Sprint(depths) != "[1 2 3 1 2 3 1]" {
		t.Fatalf("depths %v, want [1 2 3 1 2 3 1]", depths)
	}
	// The restored filesystem is the last generation's, every file kept.
	dir := f.restored(t)
	if b, err := os.ReadFile(filepath.Join(dir, "workspace", "state.txt")); err != nil || string(b) != "generation 7" {
		t.Fatalf("restored state.txt = %q, %v", b, err)
	}
	for gen := 1; gen <= 7; gen++ {
		if _, err := os.Stat(filepath.Join(dir, "home", fmt.Sprintf("gen-%d.txt", gen))); err != nil {
			t.Fatalf("generation %d's file is lost: %v", gen, err)
		}
	}

	// Once past the grace period, everything but the current chain (here
	// one flattened layer) is collected: rows and blobs.
	f.advance(2 * time.Minute)
	f.svc.collect(ctx)
	env, _ := f.st.GetEnvironment(ctx, f.account.ID)
	top, err := f.st.GetSnapshot(ctx, *env.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := f.svc.chain(ctx, &top)
	if err != nil {
		t.Fatal(err)
	}
	want := chainKeys(chain)
	slices.Sort(want)
	if got := f.storedBlobs(t); !slices.Equal(got, want) {
		t.Fatalf("blobs after collection %v, want the current chain's %v", got, want)
	}
	snaps, err := f.st.ListSnapshots(ctx, f.account.ID)
	if err != nil || len(snaps) != len(chain) {
		t.Fatalf("%d snapshot rows after collection (%v), want %d", len(snaps), err, len(chain))
	}
}

func TestCollectSparesRecentSnapshots(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 1})
	for gen := 1; gen <= 3; gen++ {
		if _, err := f.capture(t, map[string]string{"/f": fmt.Sprint(gen)}); err != nil {
			t.Fatal(err)
		}
	}
	// Replaced snapshots younger than a minute may be about to be used by
	// a run in flight: they stay, with their blobs.
	f.svc.collect(context.Background())
	if n := len(f.storedBlobs(t)); n != 3 {
		t.Fatalf("%d blobs right after the captures, want all 3", n)
	}
}

func TestSnapshotQuota(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8, SnapshotQuota: 1 << 20})
	if _, err := f.capture(t, map[string]string{"/small": "x"}); err != nil {
		t.Fatalf("a small snapshot within the quota: %v", err)
	}
	// Random content does not compress below the quota.
	big := make([]byte, 2<<20)
	_, _ = rand.Read(big)
	before := f.storedBlobs(t)
	_, err := f.capture(t, map[string]string{"/big": string(big)})
	if err == nil || !strings.Contains(errdefs.Message(err, ""), "snapshot storage quota of 1 MiB") {
		t.Fatalf("a snapshot past the quota: %v", err)
	}
	if got := f.storedBlobs(t); !slices.Equal(got, before) {
		t.Fatalf("blobs %v after the refused capture, want %v: nothing stored", got, before)
	}
}

// TestEnvironmentHasOneOwner drives the account's row through its owner
// only: a capture sets the snapshot, a PATCH can point it at an older one
// of the account's (never another account's), and deleting the account
// removes the row with the snapshots.
func TestEnvironmentHasOneOwner(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8, TTL: time.Hour})
	ctx := context.Background()
	if env, err := f.svc.PatchEnvironment(ctx, f.account.ID, EnvironmentPatch{}); err != nil || env != nil {
		t.Fatalf("empty patch without a row: %+v %v", env, err)
	}
	first, err := f.capture(t, map[string]string{"/f": "1"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.capture(t, map[string]string{"/f": "2"})
	if err != nil {
		t.Fatal(err)
	}
	env, err := f.st.GetEnvironment(ctx, f.account.ID)
	if err != nil || env.SnapshotID == nil || *env.SnapshotID != second.ID {
		t.Fatalf("after two captures: %+v %v", env, err)
	}
	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.PatchEnvironment(ctx, other.ID, EnvironmentPatch{SnapshotID: first.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another account's snapshot: %v", err)
	}
	f.advance(30 * time.Minute)
	got, err := f.svc.PatchEnvironment(ctx, f.account.ID, EnvironmentPatch{SnapshotID: first.ID, GithubRepo: "https://git.example.test/a.git"})
	if err != nil || got == nil || *got.SnapshotID != first.ID || *got.GithubRepo != "https://git.example.test/a.git" || got.ExpiresAt.Sub(f.clock().Add(time.Hour)).Abs() >= time.Millisecond {
		t.Fatalf("patch: %+v %v", got, err)
	}
	if env, err := f.st.GetEnvironment(ctx, f.account.ID); err != nil || *env.SnapshotID != first.ID {
		t.Fatalf("stored after the patch: %+v %v", env, err)
	}
	if err := f.svc.DeleteAccount(ctx, f.account.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.GetEnvironment(ctx, f.account.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("row after deleting the account: %v", err)
	}
	if blobs := f.storedBlobs(t); len(blobs) != 0 {
		t.Fatalf("blobs after deleting the account: %v", blobs)
	}
}

// TestSnapshotHooksStartFromTheAccountsSnapshot creates sandboxes through
// the manager with persistence's hooks registered: a sandbox of an account
// with a snapshot gets its chain as layers and the row records the
// snapshot; a restore the runtime refuses starts fresh, recording none;
// the layers opened are closed on every path.
func TestSnapshotHooksStartFromTheAccountsSnapshot(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8})
	ctx := context.Background()
	snap, err := f.capture(t, map[string]string{"/f": "1"})
	if err != nil {
		t.Fatal(err)
	}
	hooks := f.svc.Hooks()
	m := sandbox.NewManager(sandbox.Config{Store: f.st, Runtime: f.rt, NodeID: "here", DataDir: t.TempDir(), Persist: f.svc, Hooks: hooks})
	sb, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := f.rt.Spec(sb.ID)
	if row, _ := f.st.GetSandbox(ctx, sb.ID); len(spec.Layers) != 1 || sb.SnapshotID != snap.ID || row.SnapshotID != snap.ID {
		t.Fatalf("layers %v, snapshot %q on the answer and %q on the row; want %s", spec.Layers, sb.SnapshotID, row.SnapshotID, snap.ID)
	}
	if !slices.Contains(spec.Env, GitEnv(sb.ID)[0]) {
		t.Fatalf("env %v lacks git's credentials", spec.Env)
	}

	// The runtime refuses the restore: the sandbox starts fresh.
	f.rt.FailCreate(func(spec runtime.Spec) error {
		if len(spec.Layers) > 0 {
			return errors.New("corrupt layer")
		}
		return nil
	})
	fresh, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ = f.rt.Spec(fresh.ID)
	if row, _ := f.st.GetSandbox(ctx, fresh.ID); len(spec.Layers) != 0 || fresh.SnapshotID != "" || row.SnapshotID != "" {
		t.Fatalf("after a refused restore: layers %v, snapshot %q/%q; want a fresh start", spec.Layers, fresh.SnapshotID, row.SnapshotID)
	}
	// The workspace hook clones in the background: wait for both clones
	// (Prepare takes its turn after them) before the directories go.
	for _, row := range []store.Sandbox{sb, fresh} {
		rsb, err := f.rt.Get(ctx, row.ID)
		if err != nil {
			t.Fatal(err)
		}
		_ = f.svc.Prepare(ctx, row, rsb, false)
	}
	// Nothing is left holding the layers.
	for _, h := range hooks {
		if l, ok := h.(*layersHook); ok && len(l.held) != 0 {
			t.Fatalf("layers still held for %v", l.held)
		}
	}
}

// TestWorkspaceHookForgetsAFailedStart: a start that fails right after the
// workspace hook began its background clone runs the stop hook at once;
// the clone finishing later must not leave its memo entry behind.
func TestWorkspaceHookForgetsAFailedStart(t *testing.T) {
	f := newChainFixture(t, Options{})
	ctx := context.Background()
	sb := store.Sandbox{ID: "sbx_failed_start", AccountID: f.account.ID, NodeID: "here", Status: store.SandboxPending, Runtime: "fake"}
	rsb := f.rt.Add(sb.ID)
	h := workspaceHook{s: f.svc}
	if err := h.Poststart(ctx, &sb, rsb, false); err != nil {
		t.Fatal(err)
	}
	f.svc.mu.Lock()
	p := f.svc.prepared[sb.ID]
	f.svc.mu.Unlock()
	if p == nil {
		t.Fatal("poststart returned before the sandbox's workspace memo existed")
	}
	if err := h.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background clone never finished")
		}
	}
	f.svc.mu.Lock()
	defer f.svc.mu.Unlock()
	if len(f.svc.prepared) != 0 {
		t.Fatalf("memo entries left after the stop hook: %v", f.svc.prepared)
	}
}

// TestPrewarmFollowsTheSnapshot: the manager's Prewarm, called once an
// account's snapshot is taken (after a run, and by the setup task), starts
// its next sandbox ahead from it (the runtime's Prewarmer, here
// runtimefake's, and this service's layers); the
// account's create is handed it, with a key and environment of its own,
// and another is started ahead at once; another account's create is not;
// deleting the account's environment drops it.
func TestPrewarmFollowsTheSnapshot(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8})
	ctx := context.Background()
	f.rt.EnablePrewarm()
	m := sandbox.NewManager(sandbox.Config{Store: f.st, Runtime: f.rt, NodeID: "here", DataDir: t.TempDir(), Persist: f.svc, Hooks: f.svc.Hooks()})
	waitPrewarmed := func(owner string, want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for f.rt.PrewarmedFor(owner) != want {
			if time.Now().After(deadline) {
				t.Fatalf("prewarmed for %s: %v after 10 s, want %v", owner, !want, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	snap, err := f.capture(t, map[string]string{"/workspace/f": "1"})
	if err != nil {
		t.Fatal(err)
	}
	m.Prewarm(f.account.ID)
	waitPrewarmed(f.account.ID, true)

	sb, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := f.rt.Spec(sb.ID)
	if !f.rt.Claimed(sb.ID) || sb.SnapshotID != snap.ID || !slices.Contains(spec.Env, GitEnv(sb.ID)[0]) {
		t.Fatalf("claimed %v, snapshot %q (want %s), env %v", f.rt.Claimed(sb.ID), sb.SnapshotID, snap.ID, spec.Env)
	}
	waitPrewarmed(f.account.ID, true) // the next one, started after the claim

	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	osb, _, err := m.Create(ctx, other.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if f.rt.Claimed(osb.ID) || !f.rt.PrewarmedFor(f.account.ID) {
		t.Fatal("another account's create was handed the account's prewarmed sandbox")
	}
	for _, row := range []store.Sandbox{sb, osb} {
		if rsb, err := f.rt.Get(ctx, row.ID); err == nil {
			_ = f.svc.Prepare(ctx, row, rsb, false) // let the background clones end
		}
	}
	if _, err := m.DeleteEnvironment(ctx, f.account.ID); err != nil {
		t.Fatal(err)
	}
	if f.rt.PrewarmedFor(f.account.ID) {
		t.Fatal("the deleted environment's prewarmed sandbox is kept")
	}
}

// TestPrewarmFollowsDemand: an account that creates from its snapshot
// again and again gets as many sandboxes started ahead as it created in
// the last minute, up to the warm pool's ceiling.
func TestPrewarmFollowsDemand(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8})
	ctx := context.Background()
	f.rt.EnablePrewarm()
	m := sandbox.NewManager(sandbox.Config{Store: f.st, Runtime: f.rt, NodeID: "here", DataDir: t.TempDir(), Persist: f.svc, Hooks: f.svc.Hooks(),
		Settings: sandbox.Settings{WarmPoolMax: 3}})
	waitKept := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for f.rt.PrewarmedCount(f.account.ID) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d started ahead after 10 s, want %d", f.rt.PrewarmedCount(f.account.ID), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, err := f.capture(t, map[string]string{"/workspace/f": "1"}); err != nil {
		t.Fatal(err)
	}
	m.Prewarm(f.account.ID)
	waitKept(1)
	for i, want := range []int{1, 2, 3, 3} {
		sb, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !f.rt.Claimed(sb.ID) {
			t.Fatalf("create %d was not handed a sandbox started ahead", i+1)
		}
		// i+1 creates in the last minute, one of them just taken.
		waitKept(want)
		if rsb, err := f.rt.Get(ctx, sb.ID); err == nil {
			_ = f.svc.Prepare(ctx, sb, rsb, false) // let the background clone end
		}
	}
}

// TestPrewarmRecentAfterRestart: a restarted node (a new manager on a
// runtime that kept nothing) starts ahead again the sandboxes of the
// accounts whose snapshots changed last.
func TestPrewarmRecentAfterRestart(t *testing.T) {
	f := newChainFixture(t, Options{MaxDepth: 8})
	ctx := context.Background()
	if _, err := f.capture(t, map[string]string{"/workspace/f": "1"}); err != nil {
		t.Fatal(err)
	}
	rt := runtimefake.New()
	rt.EnablePrewarm()
	m := sandbox.NewManager(sandbox.Config{Store: f.st, Runtime: rt, NodeID: "here", DataDir: t.TempDir(), Persist: f.svc, Hooks: f.svc.Hooks()})
	m.PrewarmRecent(ctx, 0)
	time.Sleep(50 * time.Millisecond)
	if rt.PrewarmedFor(f.account.ID) {
		t.Fatal("a budget of 0 started a sandbox ahead")
	}
	m.PrewarmRecent(ctx, 8)
	deadline := time.Now().Add(10 * time.Second)
	for !rt.PrewarmedFor(f.account.ID) {
		if time.Now().After(deadline) {
			t.Fatal("the account's sandbox was not started ahead again after the restart")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunErrorsKeepHostPathsInTheLog: a run's output says why its work was
// not committed; what the sandbox's git said is the user's, what the host
// said (an exec that failed on the host, naming its paths) stays in the log.
func TestRunErrorsKeepHostPathsInTheLog(t *testing.T) {
	securitytest.Attack(t, "api",
		"a run's commit and push fail on the host (an error naming the agent socket under the data dir) and in the sandbox (git's own error), to read host paths from the run's output",
		"the run's gitError says the details are in the server log, without the host's error; git's error from inside the sandbox is given as is")
	f := newChainFixture(t, Options{})
	ctx := context.Background()
	sb := store.Sandbox{ID: "sbx_host_paths", AccountID: f.account.ID, NodeID: "here", Status: store.SandboxRunning, Runtime: "fake"}
	f.rt.Add(sb.ID)
	rsb, err := f.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	const hostErr = "dial unix /var/lib/sandboxd/runtime/gvisor/sandboxes/sbx_host_paths/agent.sock: connection refused"
	for _, c := range []struct {
		exec       func(runtime.ExecRequest) (runtime.ExecResult, error)
		want, deny string
	}{
		{func(runtime.ExecRequest) (runtime.ExecResult, error) {
			return runtime.ExecResult{}, errors.New(hostErr)
		},
			"the commit and push could not be run (details are in the server log)", "/var/lib"},
		{func(req runtime.ExecRequest) (runtime.ExecResult, error) {
			_, _ = io.WriteString(req.Stderr, "fatal: unable to access 'http://sandboxd.internal/git/x.git/'\n")
			return runtime.ExecResult{ExitCode: 128}, nil
		}, "exit status 128: fatal: unable to access 'http://sandboxd.internal/git/x.git/'", ""},
	} {
		f.rt.SetExec(func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
			return c.exec(req)
		})
		saved, _ := f.svc.AfterRun(ctx, sb, rsb, store.Run{ID: "run_host_paths", AccountID: f.account.ID})
		if saved.GitError != c.want || (c.deny != "" && strings.Contains(saved.GitError, c.deny)) {
			t.Errorf("gitError %q, want %q", saved.GitError, c.want)
		}
	}
}
