package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
		if d := r.Describe(); !strings.Contains(d, info.Version) || !strings.Contains(d, info.Path) {
			t.Errorf("Describe() = %q", d)
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
