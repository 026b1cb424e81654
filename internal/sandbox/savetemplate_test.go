package sandbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSaveSandboxFiles: what templates.Service.FromSandbox asks of the
// manager. A sandbox is found under the one access rule (another
// account's is not found), must be running here and not a fork; its
// capture is the runtime's layer of its files, over the base and the last
// layer it started from; a sandbox gone meanwhile is not running.
func TestSaveSandboxFiles(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour, PerAccount: 4})
	ctx := context.Background()
	alice := auth.Principal{AccountID: p.account.ID, Kind: p.account.Kind}
	bobAcct := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := p.st.CreateAccount(ctx, &bobAcct); err != nil {
		t.Fatal(err)
	}
	bob := auth.Principal{AccountID: bobAcct.ID, Kind: bobAcct.Kind}

	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rsb, _ := p.rt.Get(ctx, sb.ID)
	if err := rsb.WriteFile(ctx, "/workspace/made.txt", strings.NewReader("made"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.SandboxToSave(ctx, bob, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob finds alice's sandbox to save: %v", err)
	}
	got, err := p.m.SandboxToSave(ctx, alice, sb.ID)
	if err != nil || got.ID != sb.ID {
		t.Fatalf("to save: %+v %v", got, err)
	}
	var buf bytes.Buffer
	m, err := p.m.CaptureFiles(ctx, got, &buf)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := p.rt.Spec(sb.ID)
	if m.BaseImage != spec.BaseImage || m.Parent != "" || m.Entries == 0 {
		t.Fatalf("manifest %+v, spec base %q", m, spec.BaseImage)
	}
	dir := t.TempDir()
	if _, err := snapshot.Apply(ctx, &buf, dir, nil); err != nil {
		t.Fatalf("the capture is not a layer: %v", err)
	}

	// Not while a run executes in it (the run's end captures it too).
	run := store.Run{AccountID: p.account.ID, SandboxID: sb.ID, Task: "run-sandbox-command", Payload: []byte(`{}`)}
	if err := p.st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.st.StartRun(ctx, run.ID, time.Now()); !ok || err != nil {
		t.Fatalf("start run: %v %v", ok, err)
	}
	if _, err := p.m.SandboxToSave(ctx, alice, sb.ID); !errors.Is(err, errdefs.ErrNotRunning) || !strings.Contains(errdefs.Message(err, ""), "is executing") {
		t.Fatalf("while a run executes: %v", err)
	}
	if _, err := p.m.CaptureFiles(ctx, got, &buf); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("captured while a run executes: %v", err)
	}
	if ok, err := p.st.FinishRun(ctx, run.ID, store.RunCompleted, []byte(`{}`), nil, time.Now()); !ok || err != nil {
		t.Fatalf("finish run: %v %v", ok, err)
	}

	// A fork is refused: its files were copied off the layers they sat on.
	kids, err := p.m.fork(ctx, got, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.SandboxToSave(ctx, alice, kids[0].ID); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "forked") {
		t.Fatalf("a fork: %v", err)
	}
	// A stopped sandbox is not running, before and during the capture.
	if _, err := p.m.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.SandboxToSave(ctx, alice, sb.ID); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("a stopped sandbox: %v", err)
	}
	if _, err := p.m.CaptureFiles(ctx, got, &buf); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("captured after its stop: %v", err)
	}
	// A backend that cannot run templates refuses to make one.
	p.rt.SetCapabilities(runtime.Capabilities{})
	if _, err := p.m.SandboxToSave(ctx, alice, kids[0].ID); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "cannot start custom templates") {
		t.Fatalf("on a backend without templates: %v", err)
	}
}
