package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, chroot)")
	}
}

// busyboxRootfs makes a tiny root filesystem from the host's static busybox
// (Debian package busybox-static), enough to test the chroot runner without
// debootstrap or a network.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	needRoot(t)
	bb, err := lookTool("busybox")
	if err != nil {
		t.Skip(err)
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "cat", "env", "sleep", "ls", "wc", "true"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestChrootRunsInsideWithPrivateMounts(t *testing.T) {
	root := busyboxRootfs(t)
	if err := prepareBuildEnv(root); err != nil {
		t.Fatal(err)
	}
	b := newDebootstrapBuilder(slog.New(slog.DiscardHandler))
	var lines []string
	err := b.chroot(context.Background(), root, "probe",
		[]string{"sh", "-c", "cat /proc/self/mounts; ls /dev/null; env; echo extra=$EXTRA"},
		[]string{"EXTRA=yes"}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Join(lines, "\n")
	for _, want := range []string{"proc /proc proc", "sysfs /sys sysfs", "/dev/null", "PATH=/usr/local/sbin:/usr/local/bin:", "HOME=/root", "extra=yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("chroot output lacks %q:\n%s", want, out)
		}
	}
	if hostCABundle() != "" && !strings.Contains(out, "NODE_EXTRA_CA_CERTS="+buildScratch+"/ca.pem") {
		t.Errorf("build environment lacks the host CA bundle:\n%s", out)
	}
	// The caller's environment does not leak in.
	t.Setenv("SANDBOXD_SHOULD_NOT_LEAK", "1")
	lines = nil
	if err := b.chroot(context.Background(), root, "env", []string{"env"}, nil, func(l string) { lines = append(lines, l) }); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "SANDBOXD_SHOULD_NOT_LEAK") }) {
		t.Error("caller's environment reached the chroot")
	}
	// The mounts lived in the command's own namespace only.
	if m, err := mountinfo.Under(root); err != nil || len(m) > 0 {
		t.Errorf("mounts left under the rootfs: %v, %v", m, err)
	}
}

func TestChrootFailureAndCancel(t *testing.T) {
	root := busyboxRootfs(t)
	b := newDebootstrapBuilder(slog.New(slog.DiscardHandler))
	err := b.chroot(context.Background(), root, "failing step", []string{"sh", "-c", "echo first; echo the reason >&2; exit 3"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "failing step") || !strings.Contains(err.Error(), "the reason") {
		t.Errorf("error = %v, want the step's name and the end of its output", err)
	}

	// Cancelling kills the whole process group, children included, and
	// the namespace (with its mounts) goes with it.
	ctx, cancel := context.WithCancel(context.Background())
	pidFile := filepath.Join(root, "tmp/child.pid")
	done := make(chan error, 1)
	go func() {
		done <- b.chroot(ctx, root, "sleeper", []string{"sh", "-c", "sleep 600 & echo $! > /tmp/child.pid; wait"}, nil, nil)
	}()
	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the sleeper never started")
		}
		if b, err := os.ReadFile(pidFile); err == nil && len(b) > 1 {
			pid = atoi(strings.TrimSpace(string(b)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled chroot = %v, want context.Canceled", err)
	}
	// The pid is in the chroot's pid namespace, which is the host's here.
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("child %d survived the cancel", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m, err := mountinfo.Under(root); err != nil || len(m) > 0 {
		t.Errorf("mounts left under the rootfs: %v, %v", m, err)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// TestRemoveTreeDetachesMounts checks the guard that keeps a leftover bind
// mount (say of the host's /dev) from being emptied by the cleanup.
func TestRemoveTreeDetachesMounts(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	sentinel := filepath.Join(outside, "precious")
	if err := os.WriteFile(sentinel, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	mnt := filepath.Join(tree, "rootfs/dev")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(outside, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if m, err := mountinfo.Under(tree); err != nil || len(m) != 1 || m[0] != mnt {
		t.Fatalf("mountsUnder = %v, %v", m, err)
	}
	if err := removeTree(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Errorf("tree still there: %v", err)
	}
	if b, err := os.ReadFile(sentinel); err != nil || string(b) != "keep me" {
		t.Errorf("file behind the mount was touched: %q, %v", b, err)
	}
}

func TestFinishRootfs(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-resolv.conf")
	if err := os.WriteFile(outside, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk := func(name, content string) {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("etc/hostname", "buildhost\n")
	mk("var/lib/apt/lists/mirror.example_dists_bookworm_InRelease", "x")
	mk("var/lib/apt/lists/partial/.keep", "")
	mk("var/cache/apt/pkgcache.bin", "x")
	mk("var/cache/apt/archives/git_2.39_amd64.deb", "x")
	mk("var/cache/apt/archives/partial/x.deb", "x")
	mk("tmp/.sandboxd-build/ca.pem", "x")
	mk("var/tmp/junk", "x")
	mk("root/.npm/_cacache/x", "x")
	mk("usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n")
	mk("root/.bashrc", "keep")
	// An absolute symlink, as a host-style resolv.conf would be: writing
	// through it would hit the host's file.
	if err := os.Symlink(outside, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}

	if err := finishRootfs(root); err != nil {
		t.Fatal(err)
	}

	if b, _ := os.ReadFile(outside); string(b) != "nameserver 192.0.2.1\n" {
		t.Errorf("host file behind the symlink changed: %q", b)
	}
	for name, want := range map[string]string{"etc/hosts": hostsFile, "etc/resolv.conf": resolvFile, "etc/hostname": hostname, "root/.bashrc": "keep"} {
		st, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !st.Mode().IsRegular() {
			t.Errorf("%s: %v, %v", name, st, err)
			continue
		}
		if b, _ := os.ReadFile(filepath.Join(root, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	if !strings.Contains(hostsFile, "127.0.0.1\tsandboxd.internal") || !strings.Contains(hostsFile, "127.0.0.1\tlocalhost") {
		t.Errorf("hosts file lacks the required names: %q", hostsFile)
	}
	for _, gone := range []string{
		"var/lib/apt/lists/mirror.example_dists_bookworm_InRelease", "var/lib/apt/lists/partial/.keep",
		"var/cache/apt/pkgcache.bin", "var/cache/apt/archives/git_2.39_amd64.deb", "var/cache/apt/archives/partial/x.deb",
		"tmp/.sandboxd-build", "var/tmp/junk", "root/.npm", "usr/sbin/policy-rc.d",
	} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still present (%v)", gone, err)
		}
	}
	for _, kept := range []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "workspace", ".sandboxd", "tmp"} {
		if st, err := os.Stat(filepath.Join(root, kept)); err != nil || !st.IsDir() {
			t.Errorf("directory %s missing: %v", kept, err)
		}
	}
	st, err := os.Stat(filepath.Join(root, "workspace"))
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (sys.Uid != userID || sys.Gid != userID) {
		t.Errorf("/workspace owned by %d:%d, want %d", sys.Uid, sys.Gid, userID)
	}
}

func TestPrepareBuildEnv(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/sbin", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := prepareBuildEnv(root); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root, policyRCD))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("policy-rc.d: %v, %v", st, err)
	}
	env := buildEnv(root, []string{"HOME=/tmp/x"})
	if env[len(env)-1] != "HOME=/tmp/x" {
		t.Errorf("step environment does not come last: %v", env)
	}
	_, caErr := os.Stat(filepath.Join(root, buildScratch, "ca.pem"))
	hasCA := slices.Contains(env, "npm_config_cafile="+buildScratch+"/ca.pem")
	if (hostCABundle() != "") != (caErr == nil) || (caErr == nil) != hasCA {
		t.Errorf("host CA %q, copied %v, in env %v", hostCABundle(), caErr, hasCA)
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(l string) { got = append(got, l) }}
	for _, chunk := range []string{"I: Retr", "ieving a 1\nI: Val", "idating a 1\r\n", "\rprogress 50%\rprogress 100%", "\nlast"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	w.flush()
	want := []string{"I: Retrieving a 1", "I: Validating a 1", "progress 50%", "progress 100%", "last"}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
}

func TestChrootStatusFD(t *testing.T) {
	root := busyboxRootfs(t)
	b := newDebootstrapBuilder(slog.New(slog.DiscardHandler))
	var status []string
	script := fmt.Sprintf("echo on stdout; echo pmstatus:x:50:Unpacking x >&%d; echo on stderr >&2; echo dlstatus:1:10:Retrieving file 1 of 2 >&%d", statusFD, statusFD)
	if err := b.chrootStatus(context.Background(), root, "status", []string{"sh", "-c", script}, func(l string) { status = append(status, l) }); err != nil {
		t.Fatal(err)
	}
	want := []string{"pmstatus:x:50:Unpacking x", "dlstatus:1:10:Retrieving file 1 of 2"}
	if !slices.Equal(status, want) {
		t.Errorf("status lines = %q, want %q", status, want)
	}
	// Without a status callback there is no descriptor 3.
	err := b.chroot(context.Background(), root, "no status", []string{"sh", "-c", "echo x >&3"}, nil, nil)
	if err == nil {
		t.Error("writing to descriptor 3 without a status pipe succeeded")
	}
}
