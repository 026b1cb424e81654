package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// fakeRunsc is a runsc that answers --version and fails everything else,
// as a current runsc built with cgo does at boot.
func fakeRunsc(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'runsc version fake-20990101'; exit 0; }\n" +
		"[ \"$1\" = help ] && { echo ptrace; exit 0; }\n" +
		"echo 'error executing umounter: fork/exec /proc/self/exe: no such file or directory' >&2\nexit 128\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunscChoice: with none named, the current runsc is preferred when it
// boots, one that does not is rejected with its reason and Debian's in
// PATH is used instead; a runsc named explicitly is the only candidate.
func TestRunscChoice(t *testing.T) {
	if os.Getenv("SANDBOXD_RUNSC") != "" {
		t.Skip("SANDBOXD_RUNSC names the runsc")
	}
	ctx := context.Background()
	t.Run("bundled", func(t *testing.T) {
		if _, err := os.Stat(gvisor.BundledRunsc); err != nil {
			t.Skipf("%s not installed (scripts/install-runsc.sh)", gvisor.BundledRunsc)
		}
		r := newRuntime(t, t.TempDir(), nil)
		defer r.Close()
		info := r.Runsc()
		t.Logf("chosen: %+v", info)
		if info.Path != gvisor.BundledRunsc || info.Version == "" || info.Reason == "" {
			t.Fatalf("chose %+v, want %s", info, gvisor.BundledRunsc)
		}
		// A current runsc takes statx's AT_NO_AUTOMOUNT and tells a fresh
		// network namespace from the host's.
		if info.StatxShim || info.NetnsWorkaround {
			t.Errorf("the current runsc is given the old one's workarounds: %+v", info)
		}
		// Describe is public (health): the version, not the host path.
		if d := r.Describe(); !strings.Contains(d, info.Version) || strings.Contains(d, info.Path) {
			t.Errorf("Describe() = %q", d)
		}
		// The current gVisor on systrap lacks nothing.
		if d := r.Degraded(); len(d) != 0 {
			t.Errorf("Degraded() = %+v, want nothing", d)
		}
	})
	t.Run("fallback", func(t *testing.T) {
		debian, err := exec.LookPath("runsc")
		if err != nil {
			t.Skip("no runsc in PATH")
		}
		fake := fakeRunsc(t)
		r := newRuntime(t, t.TempDir(), func(o *gvisor.Options) { o.BundledRunsc = fake })
		defer r.Close()
		info := r.Runsc()
		t.Logf("chosen: %+v", info)
		if info.Path != debian {
			t.Fatalf("chose %s, want %s from PATH", info.Path, debian)
		}
		if !strings.Contains(info.Rejected[fake], "umounter") {
			t.Errorf("rejected %v: want the fake's boot error", info.Rejected)
		}
		// The fallback is said loudly: what is wrong and what is lost in
		// public words (health), why in full (the log).
		var summaries []string
		for _, d := range r.Degraded() {
			summaries = append(summaries, d.Summary)
			if strings.Contains(d.Summary, "/") && !strings.Contains(d.Summary, "scripts/install-runsc.sh") || strings.Contains(d.Summary, fake) {
				t.Errorf("a public summary names a host path: %q", d.Summary)
			}
		}
		all := strings.Join(summaries, "\n")
		if !strings.Contains(all, "fell back to runsc "+info.Version) || !strings.Contains(all, "did not boot its trial sandbox") {
			t.Errorf("Degraded() = %q, want the fallback and why", all)
		}
		if d := r.Degraded(); !strings.Contains(d[0].Detail, "umounter") || !strings.Contains(d[0].Detail, fake) {
			t.Errorf("the fallback's detail %q: want the rejected runsc and its error", d[0].Detail)
		}
		if info.StatxShim && !strings.Contains(all, "pause and fork refuse") {
			t.Errorf("Degraded() = %q, want what Debian's 2022 runsc lacks", all)
		}
		// The sandbox runs on the fallback.
		sb, err := r.Create(ctx, runtime.Spec{ID: "fallback", BaseDir: runtimetest.Rootfs(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(ctx)
		if res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
	})
	t.Run("explicit", func(t *testing.T) {
		runtimetest.Require(t, "runsc")
		fake := fakeRunsc(t)
		_, err := gvisor.New(ctx, gvisor.Options{StateDir: t.TempDir(), RunscPath: fake, AgentPath: runtimetest.AgentBinary(t), Logger: runtimetest.Logger(t)})
		if err == nil || !strings.Contains(err.Error(), "umounter") {
			t.Fatalf("New with a broken runsc named: %v, want its boot error and no fallback", err)
		}
	})
}

// TestSymlinkToRoot: Debian's 2022 runsc resolves every path through a
// symlink to / as / itself (issue 16); a current one does not.
func TestSymlinkToRoot(t *testing.T) {
	r := newRuntime(t, t.TempDir(), nil)
	defer r.Close()
	if r.Runsc().StatxShim {
		t.Skipf("%s is the 2022 runsc, which has this bug", r.Runsc())
	}
	ctx := context.Background()
	sb, err := r.Create(ctx, runtime.Spec{ID: "symlink", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	var out strings.Builder
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo hi > /workspace/f && ln -s / /tmp/r && cat /tmp/r/workspace/f && ls /tmp/r/workspace"}, Stdout: &out, Stderr: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "hi\nf\n" {
		t.Fatalf("through a symlink to /: %q (exit %d, %v)", out.String(), res.ExitCode, err)
	}
}

// TestRunscUpgradeReattach: a sandbox made by Debian's runsc keeps being
// driven by it after sandboxd restarts on the current runsc (runsc
// versions need not read each other's state), and new sandboxes get the
// current one.
func TestRunscUpgradeReattach(t *testing.T) {
	debian, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip("no runsc in PATH")
	}
	if _, err := os.Stat(gvisor.BundledRunsc); err != nil {
		t.Skipf("%s not installed", gvisor.BundledRunsc)
	}
	if os.Getenv("SANDBOXD_RUNSC") != "" {
		t.Skip("SANDBOXD_RUNSC names the runsc")
	}
	ctx := context.Background()
	state := t.TempDir()
	rootfs := runtimetest.Rootfs(t)
	old := newRuntime(t, state, func(o *gvisor.Options) { o.RunscPath = debian })
	sb, err := old.Create(ctx, runtime.Spec{ID: "made-by-old", BaseDir: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /workspace/f"}}); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	cur := newRuntime(t, state, nil)
	defer cur.Close()
	if cur.Runsc().Path != gvisor.BundledRunsc {
		t.Fatalf("restarted on %s", cur.Runsc())
	}
	again, err := cur.Get(ctx, "made-by-old")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := again.State(ctx); err != nil || st != runtime.StateRunning {
		t.Fatalf("state of the old runsc's sandbox: %v %v", st, err)
	}
	var out strings.Builder
	// A deadline turns an agent that never reconnects into a failure.
	ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := again.Exec(ectx, runtime.ExecRequest{Cmd: []string{"cat", "/workspace/f"}, Stdout: &out}); err != nil || out.String() != "kept\n" {
		t.Fatalf("exec after the restart: %q %v", out.String(), err)
	}
	// Snapshots pause it with its own runsc.
	resume, err := again.Quiesce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	fresh, err := cur.Create(ctx, runtime.Spec{ID: "made-by-new", BaseDir: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := again.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := exec.Command(debian, "--root", filepath.Join(state, "runsc"), "list", "-quiet").Output(); strings.TrimSpace(string(list)) != "" {
		t.Errorf("Debian's runsc still lists %q", list)
	}
}
