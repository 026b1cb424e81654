package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// builder fills an empty directory with a template's root filesystem. The
// Store owns everything around it (keys, locking, the temporary directory,
// publishing); a builder only writes below req.Rootfs.
type builder interface {
	build(ctx context.Context, req buildRequest) error
}

// buildRequest is one build for a builder.
type buildRequest struct {
	Template Template
	// Rootfs is an empty directory to fill.
	Rootfs string
	// Parent is the finished image of Template.Parent, if it has one.
	Parent *Image
	// Mirrors are the Debian archives for debootstrap and apt.
	Mirrors Mirrors
	// ExpectedPackages is how many packages an earlier build of the same
	// template installed, 0 if unknown; it sizes the download stage.
	ExpectedPackages int
	// Report receives progress; it is never nil.
	Report func(Event)
}

// Files the build places inside the root filesystem and removes in finalize.
const (
	buildScratch = "/tmp/.sandboxd-build" // CA bundle, npm cache
	policyRCD    = "/usr/sbin/policy-rc.d"
)

// chrootScript runs a command inside a root filesystem. It is started in a
// new mount namespace (see run), so the /proc, /sys and /dev mounts it makes
// exist only there and vanish with the last process in it, even if sandboxd
// is killed: nothing is ever mounted under the cache in the host's namespace.
const chrootScript = `set -e
root=$1; shift
mount --make-rprivate /
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"
exec chroot "$root" "$@"
`

// debootstrapBuilder builds templates with debootstrap, apt-get and commands
// run in a chroot. It needs root and the host tools debootstrap, chroot,
// mount, cp and sh.
type debootstrapBuilder struct {
	logger *slog.Logger
}

func newDebootstrapBuilder(logger *slog.Logger) *debootstrapBuilder {
	return &debootstrapBuilder{logger: logger}
}

func (b *debootstrapBuilder) build(ctx context.Context, req buildRequest) error {
	if os.Geteuid() != 0 {
		return errors.New("building images needs root (debootstrap, chroot, mount)")
	}
	t := req.Template
	// Shares of the whole build, by rough weights measured in builds: the
	// base system (debootstrap, or a copy of the parent), then packages,
	// then steps, then finalize at 95–100.
	var phases []func(ctx context.Context, lo, hi float64) error
	var weights []float64
	if req.Parent != nil {
		phases = append(phases, func(ctx context.Context, lo, hi float64) error {
			return b.copyParent(ctx, req, lo)
		})
		weights = append(weights, 1)
	} else {
		phases = append(phases, func(ctx context.Context, lo, hi float64) error {
			return b.debootstrap(ctx, req, lo, hi)
		})
		weights = append(weights, 6)
	}
	if req.Parent == nil {
		phases = append(phases, func(ctx context.Context, lo, hi float64) error {
			return b.aptInstall(ctx, req, lo, hi)
		})
		// Updates, then each requested package with a few
		// dependencies.
		weights = append(weights, 2+float64(len(t.Packages))/2)
	}
	for i, s := range t.Steps {
		phases = append(phases, func(ctx context.Context, lo, hi float64) error {
			req.Report(Event{Stage: "step", Detail: s.Name, Done: i + 1, Total: len(t.Steps), Percent: lo})
			return b.chroot(ctx, req.Rootfs, s.Name, s.Argv, s.Env, nil)
		})
		weights = append(weights, 4)
	}
	var total float64
	for _, w := range weights {
		total += w
	}
	at := 0.0
	for i, phase := range phases {
		lo := 95 * at / total
		at += weights[i]
		hi := 95 * at / total
		if err := phase(ctx, lo, hi); err != nil {
			return err
		}
		if i == 0 {
			// The build environment goes in once there is a root
			// filesystem to put it in.
			if err := prepareBuildEnv(req.Rootfs); err != nil {
				return err
			}
		}
	}
	req.Report(Event{Stage: "finalize", Percent: 95})
	return b.finalize(ctx, req.Rootfs)
}

// debootstrap installs the variant's base system. Extra packages go through
// apt-get afterwards: debootstrap's own resolver mishandles virtual packages
// and alternatives (it fails on npm's dependencies), apt's does not.
// ca-certificates comes with the base so apt can use https mirrors.
func (b *debootstrapBuilder) debootstrap(ctx context.Context, req buildRequest, lo, hi float64) error {
	t := req.Template
	tool, err := lookTool("debootstrap")
	if err != nil {
		return err
	}
	tr := &debootstrapTracker{expected: req.ExpectedPackages}
	argv := []string{tool, "--variant=" + t.Variant, "--components=main", "--include=ca-certificates", t.Suite, req.Rootfs, req.Mirrors.Main}
	err = b.run(ctx, "debootstrap", argv, append(os.Environ(), "LC_ALL=C"), true, nil, func(line string) {
		if ev, ok := tr.feed(line); ok {
			ev.Percent = lo + (hi-lo)*ev.Percent/100
			req.Report(ev)
		}
	})
	if err != nil {
		// debootstrap's own log holds dpkg's reasons; the build
		// directory is about to be removed, so keep its end.
		if tail := fileTail(filepath.Join(req.Rootfs, "debootstrap/debootstrap.log"), 30); tail != "" {
			err = fmt.Errorf("%w\ndebootstrap.log ends:\n%s", err, tail)
		}
		return err
	}
	return nil
}

// aptInstall points the image's APT at the main, updates and security
// archives, applies the updates released since the suite's point release,
// then installs the template's packages, all with apt-get inside the root
// filesystem. Its shares of [lo, hi]: update 0–15%, upgrade 15–35%,
// install the rest.
func (b *debootstrapBuilder) aptInstall(ctx context.Context, req buildRequest, lo, hi float64) error {
	t := req.Template
	root, err := os.OpenRoot(req.Rootfs)
	if err != nil {
		return fmt.Errorf("configure apt: %w", err)
	}
	err = replaceFile(root, "etc/apt/sources.list.d/debian.sources", []byte(aptSourcesFile(t.Suite, req.Mirrors)), 0o644)
	if err == nil {
		err = root.Remove("etc/apt/sources.list") // debootstrap's, now replaced
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	root.Close()
	if err != nil {
		return fmt.Errorf("configure apt: %w", err)
	}

	// Status lines go to their own descriptor: with APT::Status-Fd=1,
	// maintainer scripts run by dpkg triggers fail writing to stdout
	// (update-ca-certificates: "echo: I/O error").
	opts := []string{"-o", fmt.Sprintf("APT::Status-Fd=%d", statusFD), "-o", "Dpkg::Use-Pty=0"}
	if _, err := os.Stat(filepath.Join(req.Rootfs, buildScratch, "ca.pem")); err == nil {
		opts = append(opts, "-o", "Acquire::https::CaInfo="+path.Join(buildScratch, "ca.pem"))
	}
	runs := []struct {
		what   string
		argv   []string
		lo, hi float64
	}{
		{"apt-get update", append([]string{"apt-get", "update"}, opts...), 0, 0.15},
		{"apt-get dist-upgrade", append([]string{"apt-get", "dist-upgrade", "--yes"}, opts...), 0.15, 0.35},
		{"apt-get install", append(append([]string{"apt-get", "install", "--yes", "--no-install-recommends"}, opts...), t.Packages...), 0.35, 1},
	}
	for _, r := range runs {
		if r.what == "apt-get install" && len(t.Packages) == 0 {
			continue
		}
		rlo, rhi := lo+(hi-lo)*r.lo, lo+(hi-lo)*r.hi
		stage := strings.TrimPrefix(r.what, "apt-get ")
		req.Report(Event{Stage: stage, Percent: rlo})
		var tr aptTracker
		err := b.chrootStatus(ctx, req.Rootfs, r.what, r.argv, func(line string) {
			if ev, ok := tr.feed(line); ok {
				ev.Percent = rlo + (rhi-rlo)*ev.Percent/100
				if stage != "install" {
					ev.Stage = stage + " " + ev.Stage
				}
				req.Report(ev)
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// copyParent starts the root filesystem as a copy of the parent image's,
// keeping hard links, owners, modes, xattrs and device nodes, and sharing
// blocks where the file system can (reflink).
func (b *debootstrapBuilder) copyParent(ctx context.Context, req buildRequest, lo float64) error {
	req.Report(Event{Stage: "copy", Detail: req.Parent.ID, Percent: lo})
	cp, err := lookTool("cp")
	if err != nil {
		return err
	}
	argv := []string{cp, "-a", "--reflink=auto", req.Parent.Rootfs + "/.", req.Rootfs + "/"}
	return b.run(ctx, "copy "+req.Parent.ID, argv, os.Environ(), false, nil, nil)
}

// buildEnv is the environment of commands run inside the root filesystem:
// fixed, not the caller's, so builds do not depend on who runs them; only
// proxy settings and an npm registry override pass through from the host.
func buildEnv(rootfs string, extra []string) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
		"TMPDIR=/tmp",
		"DEBIAN_FRONTEND=noninteractive",
		"npm_config_cache=" + buildScratch + "/npm-cache",
		"npm_config_update_notifier=false",
		"npm_config_fund=false",
		"npm_config_audit=false",
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "npm_config_registry"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	// The host's CA bundle, copied in by prepareBuildEnv, so downloads
	// work wherever the host's own do (including behind a TLS-inspecting
	// proxy whose CA only the host trusts). It is removed in finalize and
	// never part of the image.
	if _, err := os.Stat(filepath.Join(rootfs, buildScratch, "ca.pem")); err == nil {
		ca := buildScratch + "/ca.pem"
		env = append(env, "NODE_EXTRA_CA_CERTS="+ca, "npm_config_cafile="+ca,
			"SSL_CERT_FILE="+ca, "CURL_CA_BUNDLE="+ca, "GIT_SSL_CAINFO="+ca)
	}
	return append(env, extra...)
}

// prepareBuildEnv puts what commands in the chroot need into the root
// filesystem: the host's DNS configuration and CA bundle, and a policy-rc.d
// that keeps package scripts from starting services.
func prepareBuildEnv(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("prepare build environment: %w", err)
	}
	defer root.Close()
	if resolv, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		if err := replaceFile(root, "etc/resolv.conf", resolv, 0o644); err != nil {
			return fmt.Errorf("prepare build environment: %w", err)
		}
	}
	if err := root.MkdirAll(strings.TrimPrefix(buildScratch, "/"), 0o755); err != nil {
		return fmt.Errorf("prepare build environment: %w", err)
	}
	if ca := hostCABundle(); ca != "" {
		data, err := os.ReadFile(ca)
		if err != nil {
			return fmt.Errorf("prepare build environment: %w", err)
		}
		if err := replaceFile(root, strings.TrimPrefix(buildScratch, "/")+"/ca.pem", data, 0o644); err != nil {
			return fmt.Errorf("prepare build environment: %w", err)
		}
	}
	if err := root.MkdirAll(strings.TrimPrefix(path.Dir(policyRCD), "/"), 0o755); err != nil {
		return fmt.Errorf("prepare build environment: %w", err)
	}
	if err := replaceFile(root, strings.TrimPrefix(policyRCD, "/"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return fmt.Errorf("prepare build environment: %w", err)
	}
	return nil
}

// hostCABundle returns the host's CA bundle, or "" if it has none.
func hostCABundle() string {
	candidates := []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}
	if v := os.Getenv("SSL_CERT_FILE"); v != "" {
		candidates = append([]string{v}, candidates...)
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c
		}
	}
	return ""
}

// Files every image gets. /etc/resolv.conf is a placeholder: a sandbox has
// no network unless the runtime gives it one, and then the runtime writes it.
const (
	hostsFile  = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.0.1\tsandboxd.internal\n"
	resolvFile = "# Written by the sandbox runtime when the sandbox has a network.\n"
	hostname   = "sandbox\n"
	userName   = "user"
	userID     = 1000
)

// finalize gives every image the same finishing touches (bump formatVersion
// when changing them): the unprivileged user, /workspace, /.sandboxd for the
// runtime's guest agent, fixed /etc/hosts, /etc/hostname and resolv.conf,
// and no apt lists, package caches or build scratch files.
func (b *debootstrapBuilder) finalize(ctx context.Context, rootfs string) error {
	addUser := fmt.Sprintf("id -u %[1]s >/dev/null 2>&1 || useradd --uid %[2]d --user-group --create-home --shell /bin/bash %[1]s", userName, userID)
	if err := b.chroot(ctx, rootfs, "add user", []string{"sh", "-c", addUser}, nil, nil); err != nil {
		return err
	}
	return finishRootfs(rootfs)
}

// finishRootfs is the part of finalize done from outside the chroot. All
// paths go through os.Root, so a symbolic link inside the image (say an
// /etc/resolv.conf pointing at /run/...) can never redirect a write or a
// removal to the host.
func finishRootfs(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	defer root.Close()
	for _, d := range []string{"workspace", ".sandboxd"} {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("finalize: %w", err)
		}
	}
	if err := root.Lchown("workspace", userID, userID); err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	for name, content := range map[string]string{"etc/hosts": hostsFile, "etc/resolv.conf": resolvFile, "etc/hostname": hostname} {
		if err := replaceFile(root, name, []byte(content), 0o644); err != nil {
			return fmt.Errorf("finalize: %w", err)
		}
	}
	if err := root.Remove(strings.TrimPrefix(policyRCD, "/")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("finalize: %w", err)
	}
	// Directory contents to drop, with the entries to keep in each: apt
	// expects its lists/partial and archives/partial directories.
	clean := []struct {
		dir  string
		keep []string
	}{
		{"var/lib/apt/lists", []string{"partial", "lock"}},
		{"var/lib/apt/lists/partial", nil},
		{"var/cache/apt", []string{"archives"}},
		{"var/cache/apt/archives", []string{"partial", "lock"}},
		{"var/cache/apt/archives/partial", nil},
		{"tmp", nil},
		{"var/tmp", nil},
	}
	for _, c := range clean {
		if err := emptyDir(root, c.dir, c.keep); err != nil {
			return fmt.Errorf("finalize: %w", err)
		}
	}
	// Caches that installers create in root's home.
	for _, d := range []string{"root/.npm", "root/.cache"} {
		if err := root.RemoveAll(d); err != nil {
			return fmt.Errorf("finalize: %w", err)
		}
	}
	return nil
}

// emptyDir removes the entries of dir except those named in keep; a missing
// dir is fine.
func emptyDir(root *os.Root, dir string, keep []string) error {
	f, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, n := range names {
		if slices.Contains(keep, n) {
			continue
		}
		if err := root.RemoveAll(dir + "/" + n); err != nil {
			return err
		}
	}
	return nil
}

// replaceFile writes name inside root as a new regular file, removing what
// was there first (a symbolic link is removed, not followed).
func replaceFile(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chroot runs argv inside rootfs with the build environment plus env.
func (b *debootstrapBuilder) chroot(ctx context.Context, rootfs, what string, argv, env []string, onLine func(string)) error {
	return b.chrootWith(ctx, rootfs, what, argv, env, nil, onLine)
}

// chrootStatus is chroot for commands that write machine-readable status
// lines to file descriptor statusFD; each such line goes to onStatus.
func (b *debootstrapBuilder) chrootStatus(ctx context.Context, rootfs, what string, argv []string, onStatus func(string)) error {
	return b.chrootWith(ctx, rootfs, what, argv, nil, onStatus, nil)
}

func (b *debootstrapBuilder) chrootWith(ctx context.Context, rootfs, what string, argv, env []string, onStatus, onLine func(string)) error {
	sh, err := lookTool("sh")
	if err != nil {
		return err
	}
	full := append([]string{sh, "-c", chrootScript, "sandboxd-chroot", rootfs}, argv...)
	// The script itself runs on the host with the build environment; its
	// PATH has the sbin directories where mount and chroot live.
	return b.run(ctx, what, full, buildEnv(rootfs, env), true, onStatus, onLine)
}

// statusFD is the file descriptor on which commands run with an onStatus
// callback find the write end of the status pipe.
const statusFD = 3

// run starts argv and waits for it, passing each line of its combined output
// to onLine and, if onStatus is set, each line it writes to statusFD to
// onStatus. With privateMounts it runs in a new mount namespace, so mounts
// it makes die with it. It runs in its own process group, killed as a whole
// when ctx ends and after the command exits, so no stray child keeps running
// (or keeps the namespace and its mounts alive). The error carries the end
// of the output.
func (b *debootstrapBuilder) run(ctx context.Context, what string, argv, env []string, privateMounts bool, onStatus, onLine func(string)) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if privateMounts {
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	tail := &tailBuffer{max: 40}
	lw := &lineWriter{fn: func(line string) {
		tail.add(line)
		b.logger.Debug("image build output", "what", what, "line", line)
		if onLine != nil {
			onLine(line)
		}
	}}
	cmd.Stdout = lw
	cmd.Stderr = lw

	var statusR, statusW *os.File
	if onStatus != nil {
		var err error
		if statusR, statusW, err = os.Pipe(); err != nil {
			return fmt.Errorf("%s: status pipe: %w", what, err)
		}
		defer statusR.Close()
		cmd.ExtraFiles = []*os.File{statusW} // descriptor 3 == statusFD
	}
	start := time.Now()
	err := cmd.Start()
	if statusW != nil {
		statusW.Close() // the child has its copy
	}
	if err != nil {
		return fmt.Errorf("%s: start %s: %w", what, argv[0], err)
	}
	statusDone := make(chan struct{})
	if statusR != nil {
		go func() {
			defer close(statusDone)
			sw := &lineWriter{fn: onStatus}
			_, _ = io.Copy(sw, statusR)
			sw.flush()
		}()
	} else {
		close(statusDone)
	}
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-statusDone:
	case <-time.After(10 * time.Second):
		// Something outside the process group kept the pipe open;
		// closing our end ends the copy.
		statusR.Close()
		<-statusDone
	}
	lw.flush()
	b.logger.Debug("image build command finished", "what", what, "elapsed", time.Since(start).Round(time.Millisecond), "err", err)
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%s: %w; output ends:\n%s", what, err, tail.String())
	}
	return nil
}

// lookTool finds a host tool on PATH or in the usual system directories,
// which a non-login root shell's PATH may lack.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: install it (Debian package %s)", name, toolPackage(name))
}

func toolPackage(name string) string {
	switch name {
	case "debootstrap":
		return "debootstrap"
	case "mkfs.ext4":
		return "e2fsprogs"
	case "mount":
		return "mount"
	case "sh":
		return "dash"
	default:
		return "coreutils"
	}
}

// lineWriter splits what is written to it into lines (at \n or \r, since
// progress output redraws lines with \r) and calls fn for each.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			break
		}
		if line := string(w.buf[:i]); line != "" {
			w.fn(line)
		}
		w.buf = w.buf[i+1:]
	}
	// A command that never ends a line must not grow the buffer forever.
	if len(w.buf) > 64*1024 {
		w.fn(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = nil
	}
}

// tailBuffer keeps the last max lines added to it.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *tailBuffer) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// fileTail returns the last n lines of a file, or "" if it cannot be read.
func fileTail(name string, n int) string {
	data, err := os.ReadFile(name)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// aptTracker turns apt-get's machine-readable status lines (APT::Status-Fd)
// into progress: "dlstatus:N:PERCENT:Retrieving file N of M" while
// downloading (0–40) and "pmstatus:PKG:PERCENT:Unpacking pkg (arch)" while
// dpkg runs (40–100).
type aptTracker struct {
	percent float64
}

func (t *aptTracker) feed(line string) (Event, bool) {
	kind, rest, ok := strings.Cut(line, ":")
	if !ok || (kind != "dlstatus" && kind != "pmstatus") {
		return Event{}, false
	}
	// The package name may itself hold a colon (libc6:amd64); the percent
	// and the message are the last two fields only when split from the
	// right of the first colon-free field.
	fields := strings.SplitN(rest, ":", 3)
	if len(fields) < 3 {
		return Event{}, false
	}
	item, pctText, msg := fields[0], fields[1], fields[2]
	if kind == "pmstatus" {
		// "pmstatus:libc6:amd64:12.5:Unpacking ..." puts the
		// architecture in fields[1].
		if _, err := strconv.ParseFloat(pctText, 64); err != nil {
			more := strings.SplitN(msg, ":", 2)
			if len(more) == 2 {
				item, pctText, msg = item+":"+pctText, more[0], more[1]
			}
		}
	}
	pct, err := strconv.ParseFloat(pctText, 64)
	if err != nil {
		return Event{}, false
	}
	var ev Event
	if kind == "dlstatus" {
		// dlstatus's item is a counter; the message says "file N of M".
		ev = Event{Stage: "download", Detail: msg}
		var n, m int
		if _, err := fmt.Sscanf(msg, "Retrieving file %d of %d", &n, &m); err == nil {
			ev.Done, ev.Total, ev.Detail = n, m, ""
		}
		pct = 40 * pct / 100
	} else {
		// Messages: "Preparing x", "Unpacking x", "Preparing to
		// configure x", "Configuring x", "Installed x", "Running dpkg".
		verb, _, _ := strings.Cut(msg, " ")
		stage := "unpack"
		switch {
		case verb == "Configuring" || verb == "Installed" || strings.HasPrefix(msg, "Preparing to configure"):
			stage = "configure"
		case item == "dpkg-exec":
			stage = "install"
		}
		name, _, _ := strings.Cut(item, ":")
		ev = Event{Stage: stage, Detail: name}
		if item == "dpkg-exec" {
			ev.Detail = ""
		}
		pct = 40 + 60*pct/100
	}
	if pct > t.percent {
		t.percent = pct
	}
	ev.Percent = t.percent
	return ev, true
}
