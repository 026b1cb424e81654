package image

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// These tests build real images with debootstrap: they need root and network
// access to the host's Debian mirror (and, for full, the npm registry), and
// take minutes, so they run only when asked:
//
//	SANDBOXD_TEST_IMAGES=1       build minimal (≈ 1–2 min)
//	SANDBOXD_TEST_IMAGES_FULL=1  build base and full (≈ 5–10 min)
//
// SANDBOXD_TEST_IMAGE_CACHE names a cache directory to build into and keep
// (so a second run reuses it); by default each run builds from scratch into
// a temporary one.

func integrationStore(t *testing.T, env string) (*Store, *bytes.Buffer) {
	t.Helper()
	if os.Getenv(env) != "1" {
		t.Skipf("set %s=1 to build real images (needs root and network)", env)
	}
	needRoot(t)
	cache := os.Getenv("SANDBOXD_TEST_IMAGE_CACHE")
	if cache == "" {
		cache = t.TempDir()
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("store log:\n%s", logs.String())
		}
	})
	return NewStore(cache, logger), &logs
}

// inImage runs a shell script inside the image, as build steps run, but with
// /tmp and /root on throwaway tmpfs mounts so that the check leaves no trace
// in the image (a kept SANDBOXD_TEST_IMAGE_CACHE stays pristine).
func inImage(t *testing.T, img *Image, script string) string {
	t.Helper()
	const wrapper = `set -e
root=$1; shift
mount --make-rprivate /
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
mount -t tmpfs tmpfs "$root/root"
exec chroot "$root" "$@"
`
	cmd := exec.Command("sh", "-c", wrapper, "check", img.Rootfs, "sh", "-ec", script)
	cmd.Env = buildEnv(img.Rootfs, []string{"HOME=/root"})
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", img.ID, script, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestIntegrationMinimal(t *testing.T) {
	s, logs := integrationStore(t, "SANDBOXD_TEST_IMAGES")
	ctx := context.Background()
	start := time.Now()
	img, err := s.Ensure(ctx, "minimal", &progress.Lines{Logger: s.logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("minimal: %s, %d MiB, %d packages, built in %s (this call %s)", img.ID, img.Size>>20, len(img.Packages), img.BuildDuration.Round(time.Second), time.Since(start).Round(time.Second))

	// Progress went to the log as structured lines with the stages of
	// debootstrap and apt (when this call built it, not a kept cache).
	if !img.CreatedAt.Before(start.Truncate(time.Second)) {
		for _, want := range []string{"step=retrieve", "step=unpack", "step=configure", "step=download", "step=finalize", "percent=", "elapsed="} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("build log lacks %s", want)
			}
		}
	}

	if out := inImage(t, img, "git --version"); !strings.HasPrefix(out, "git version ") {
		t.Errorf("git --version printed %q", out)
	}
	// With only the plain chroot(8), as another tool would use the rootfs.
	if out, err := exec.Command("chroot", img.Rootfs, "git", "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "git version ") {
		t.Errorf("chroot git --version: %q, %v", out, err)
	}
	out := inImage(t, img, "id user; cat /etc/hosts; ls -ld /workspace /.sandboxd; curl --version | head -1; ls /var/lib/apt/lists")
	for _, want := range []string{"uid=1000(user) gid=1000(user)", "127.0.0.1\tlocalhost", "127.0.0.1\tsandboxd.internal", "user user", "/workspace", "/.sandboxd", "curl "} {
		if !strings.Contains(out, want) {
			t.Errorf("image check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "InRelease") || strings.Contains(out, "_Packages") {
		t.Errorf("apt lists were not removed:\n%s", out)
	}
	resolv, err := os.ReadFile(filepath.Join(img.Rootfs, "etc/resolv.conf"))
	if err != nil || string(resolv) != resolvFile {
		t.Errorf("resolv.conf = %q, %v", resolv, err)
	}
	names := map[string]bool{}
	for _, p := range img.Packages {
		names[p.Name] = true
	}
	for _, want := range []string{"git", "curl", "ca-certificates", "bash", "passwd"} {
		if !names[want] {
			t.Errorf("manifest lacks package %s", want)
		}
	}
	if m, err := mountinfo.Under(s.Dir()); err != nil || len(m) > 0 {
		t.Errorf("mounts left under the cache: %v, %v", m, err)
	}

	// Cached: the second Ensure returns the same image without building.
	again, err := s.Ensure(ctx, "minimal", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != img.ID || !again.CreatedAt.Equal(img.CreatedAt) {
		t.Errorf("second Ensure returned %s created %v, want %s created %v", again.ID, again.CreatedAt, img.ID, img.CreatedAt)
	}

	// The ext4 form holds the same tree and checks clean.
	ext4Start := time.Now()
	p, err := img.Ext4(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ext4: %s in %s", p, time.Since(ext4Start).Round(time.Millisecond))
	if out, err := exec.Command("e2fsck", "-fn", p).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn: %v\n%s", err, out)
	}
	hosts, err := exec.Command("debugfs", "-R", "cat /etc/hosts", p).Output()
	if err != nil || string(hosts) != hostsFile {
		t.Errorf("/etc/hosts in the ext4 image = %q, %v", hosts, err)
	}
}

func TestIntegrationFull(t *testing.T) {
	s, _ := integrationStore(t, "SANDBOXD_TEST_IMAGES_FULL")
	ctx := context.Background()
	img, err := s.Ensure(ctx, "full", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full: %s, %d MiB, %d packages, built in %s", img.ID, img.Size>>20, len(img.Packages), img.BuildDuration.Round(time.Second))
	base, err := s.Lookup("base")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base: %s, %d MiB, %d packages, built in %s", base.ID, base.Size>>20, len(base.Packages), base.BuildDuration.Round(time.Second))
	if img.Parent != base.ID {
		t.Errorf("full's parent = %q, want %s", img.Parent, base.ID)
	}
	out := inImage(t, img, "node --version; npm --version; opencode --version; claude --version; openclaw --version; python3 --version; git --version")
	t.Logf("versions:\n%s", out)
	for _, want := range []string{"v" + nodeVersion, npmVersion, opencodeVersion, claudeCodeVersion, "Python 3", "git version"} {
		if !strings.Contains(out, want) {
			t.Errorf("versions lack %q", want)
		}
	}
	got := map[string]string{}
	for _, p := range img.Highlights {
		got[p.Name] = p.Version
	}
	for name, version := range map[string]string{"opencode-ai": opencodeVersion, "@anthropic-ai/claude-code": claudeCodeVersion, "openclaw": openclawVersion, "npm": npmVersion} {
		if got[name] != version {
			t.Errorf("manifest highlights %s = %q, want %s", name, got[name], version)
		}
	}
}
