package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// platformOrder is gVisor's platforms in order of preference. systrap
// before ptrace by measurement (bench/README.md, "A current gVisor"): with
// the current runsc, systrap is as fast to start as ptrace and several
// times faster on syscall-heavy work (git status, Python imports, npm ci).
// kvm would be faster still where it works; here it hangs (nested PVM), and
// the trial's timeout rejects it.
var platformOrder = []string{"systrap", "kvm", "ptrace"}

// probeTimeout bounds one trial run: a working platform starts and exits in
// well under a second, and kvm on a host where it cannot run (nested PVM)
// hangs forever rather than failing.
const probeTimeout = 4 * time.Second

// probeResult is what trial sandboxes found out about one runsc binary on
// this host. It is cached in the state dir per binary (version, size and
// modification time) and kernel, because a hanging kvm trial costs seconds.
type probeResult struct {
	Runsc    string            `json:"runsc"`
	Kernel   string            `json:"kernel"`
	Platform string            `json:"platform"`
	Rejected map[string]string `json:"rejected,omitempty"`
	// StatxShim: statx with AT_NO_AUTOMOUNT failed inside (runsc before
	// 2023), so sandboxes preload the shim of statxcompat.go.
	StatxShim bool `json:"statx_shim"`
	// NetnsWorkaround: runsc refused --network=sandbox in a fresh network
	// namespace, taking it for the host's (see sandboxNetCmd), and took it
	// with /proc/sys/net hidden.
	NetnsWorkaround bool `json:"netns_workaround"`
	// NetworkError: neither worked; sandboxes with a network will fail.
	NetworkError string `json:"network_error,omitempty"`
	// NoTTYSignals: the agent's trial found that ^C on a terminal
	// reached the reader as a byte, no SIGINT sent (runsc before 2023),
	// so sandboxes start their agent with --tty-signals.
	NoTTYSignals bool `json:"no_tty_signals"`
}

// probeFormat names what probeResult holds, in its cache key: a result
// cached before a field was added is probed again.
const probeFormat = "2"

// kernelRelease is the host kernel's release, which probes are cached by.
func kernelRelease() string {
	release, _ := host.Uname()
	return release
}

// probe finds, for the runsc at path (whose version line is version), the
// platform to use (want, or the first of platformOrder whose trial sandbox
// boots) and which of the old runsc's workarounds it needs. It decides by
// trial rather than by runsc's version date because the date tells nothing
// of a binary built from an unknown commit, or of the kernel: the netns
// check broke only with newer kernels (see sandboxNetCmd), and a current
// runsc built with cgo fails at boot (see the package doc).
func (r *Runtime) probe(ctx context.Context, path, version, want string) (probeResult, error) {
	key := version + "\x00" + kernelRelease() + "\x00" + want + "\x00" + probeFormat
	if fi, err := os.Stat(path); err == nil {
		key += fmt.Sprintf("\x00%d\x00%d", fi.Size(), fi.ModTime().UnixNano())
	}
	sum := sha256.Sum256([]byte(key))
	cachePath := filepath.Join(r.StateDir(), "probe-"+hex.EncodeToString(sum[:8])+".json")
	var c probeResult
	if b, err := os.ReadFile(cachePath); err == nil && json.Unmarshal(b, &c) == nil && c.Platform != "" {
		return c, nil
	}
	order := []string{want}
	listed := map[string]bool{want: true}
	if want == "" {
		supported, err := runscOutput(ctx, path, "help", "platforms")
		if err != nil {
			return c, fmt.Errorf("list gVisor platforms: %w", err)
		}
		order, listed = platformOrder, map[string]bool{}
		for _, f := range strings.Fields(supported) {
			listed[f] = true
		}
	}
	c = probeResult{Runsc: version, Kernel: kernelRelease(), Rejected: map[string]string{}}
	var out string
	for _, p := range order {
		if !listed[p] {
			c.Rejected[p] = "not supported by this runsc"
			continue
		}
		if p == "kvm" {
			if _, err := os.Stat("/dev/kvm"); err != nil {
				c.Rejected[p] = "no /dev/kvm"
				continue
			}
		}
		var err error
		if out, err = r.trial(ctx, path, p, false, false); err != nil {
			c.Rejected[p] = err.Error()
			r.log.Info("gVisor platform rejected", "runsc", path, "platform", p, "reason", err)
			continue
		}
		c.Platform = p
		break
	}
	if c.Platform == "" {
		return c, fmt.Errorf("no gVisor platform works with %s on this host: %v", path, c.Rejected)
	}
	// The agent's `version --probe` says whether statx took the flag; an
	// agent that does not know --probe says nothing, and the shim is kept.
	c.StatxShim = !strings.Contains(out, "statx-no-automount: ok")
	// Only a clear "none" counts: an agent that could not tell leaves the
	// kernel's terminals as they are.
	c.NoTTYSignals = strings.Contains(out, "tty-signals: none")
	if _, err := r.trial(ctx, path, c.Platform, true, false); err != nil {
		c.NetnsWorkaround = true
		if _, err2 := r.trial(ctx, path, c.Platform, true, true); err2 != nil {
			c.NetworkError = fmt.Sprintf("%v; with /proc/sys/net hidden: %v", err, err2)
			r.log.Warn("gVisor sandboxes with a network will not start", "runsc", path, "err", c.NetworkError)
		}
	}
	if b, err := json.Marshal(c); err == nil {
		_ = os.WriteFile(cachePath, b, 0o600)
	}
	return c, nil
}

func runscOutput(ctx context.Context, runsc string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, runsc, args...).CombinedOutput()
	return string(out), err
}

// trial runs `sandbox-agent version --probe` in a throwaway sandbox of the
// runsc at path on platform p and returns what it printed. With network,
// the sandbox runs gVisor's netstack (--network=sandbox) in a network
// namespace of its own, which runsc makes (the spec names none), and
// hidden hides /proc/sys/net from runsc as sandboxNetCmd does.
func (r *Runtime) trial(ctx context.Context, path, p string, network, hidden bool) (string, error) {
	dir, err := newTrialDir(r.StateDir())
	if err != nil {
		return "", err
	}
	cid := "probe-" + p + "-" + host.NewCID("")
	// Whatever ends the trial (its answer, the timeout, ctx), nothing of
	// it runs on once it returns.
	defer endTrial(path, dir, cid)
	root := filepath.Join(dir, "runsc")
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{root, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	agent, err := os.ReadFile(filepath.Join(r.StateDir(), "bin", "sandbox-agent"))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "sandbox-agent"), agent, 0o755); err != nil {
		return "", err
	}
	spec := &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{Args: []string{"/sandbox-agent", "version", "--probe"}, Cwd: "/", Env: []string{"PATH=/"}},
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux:   &specs.Linux{Namespaces: namespaces(), CgroupsPath: trialCgroup(dir)},
	}
	if err := writeSpec(dir, spec); err != nil {
		return "", err
	}
	tctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	mode := "none"
	if network {
		mode = "sandbox"
	}
	args := []string{"--root", root, "--platform", p, "--network", mode, "run", "--bundle", dir, cid}
	var cmd *exec.Cmd
	if hidden {
		cmd = sandboxNetCmd(context.Background(), path, args)
	} else {
		cmd = exec.Command(path, args...)
	}
	// Its own process group, so that a hung `runsc run` dies with what it
	// started itself; the sandbox and gofer, which are not in it, end with
	// the trial's cgroup (endTrial).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-done:
	case <-tctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		runErr = fmt.Errorf("no answer within %v", probeTimeout)
	}
	if runErr != nil {
		return "", fmt.Errorf("%w: %s", runErr, host.LastLine(out.String()))
	}
	if !strings.Contains(out.String(), "sandbox-agent") {
		return "", errors.New("trial sandbox printed nothing")
	}
	return out.String(), nil
}

// A trial (a platform trial here, a save trial in saveprobe.go) runs in a
// directory of its own in the state dir, probe-<random>, whose name is also
// the host cgroup runsc puts the trial's sandbox and gofer in (the spec's
// cgroupsPath; trials set no limits). Neither process is a child of ours
// nor in the process group of the `runsc run` that started them, and a
// save trial's container is detached: killing the group, or the whole
// sandboxd, leaves them running (its agent sleeps five minutes). So a trial
// ends by ending its cgroup (endTrial), whatever ended it, and a start ends
// the cgroups of the trials a killed process left (removeTrialDirs).

// newTrialDir makes a trial's directory in stateDir.
func newTrialDir(stateDir string) (string, error) {
	dir := filepath.Join(stateDir, "probe-"+host.NewCID(""))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// trialCgroup is the host cgroup of the trial in dir.
func trialCgroup(dir string) string { return "/sandboxd/" + filepath.Base(dir) }

// trialEndTimeout bounds the `runsc delete` that ends a trial's container.
const trialEndTimeout = 10 * time.Second

// endTrial ends the trial in dir, whose container (of the runsc at path)
// is cid ("" when runsc was never asked for one): runsc deletes it, with a
// context of its own (the trial's may be what ended it), what still runs
// in its cgroup is killed and the group removed (host.EndCgroup), and its
// directory goes with the null-netns mount in its runsc root.
func endTrial(path, dir, cid string) {
	if cid != "" {
		ctx, cancel := context.WithTimeout(context.Background(), trialEndTimeout)
		_ = exec.CommandContext(ctx, path, "--root", filepath.Join(dir, "runsc"), "delete", "--force", cid).Run()
		cancel()
	}
	_ = host.EndCgroup(trialCgroup(dir))
	unmountNullNetns(filepath.Join(dir, "runsc"))
	_ = os.RemoveAll(dir)
}

// unmountNullNetns undoes what a current runsc leaves mounted in its
// --root: it pins the empty network namespace its gofers share by
// bind-mounting it at <root>/null-netns (concurrent starts may stack
// several), and a directory holding such a mount cannot be removed
// (EBUSY). Without it the next `runsc run` simply makes a new one.
func unmountNullNetns(root string) {
	path := filepath.Join(root, "null-netns")
	for unix.Unmount(path, unix.MNT_DETACH) == nil {
	}
}

// ReleaseRoot undoes what runsc leaves mounted under a --root it was given
// (see unmountNullNetns), so that the directory can be removed: for bare
// runsc runs outside the backend, such as the benchmarks' baselines.
func ReleaseRoot(root string) { unmountNullNetns(root) }
