package gvisor

import (
	"bytes"
	"context"
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

// platformOrder is gVisor's platforms, fastest first.
var platformOrder = []string{"systrap", "kvm", "ptrace"}

// probeTimeout bounds one trial run: a working platform starts and exits in
// well under a second, and kvm on a host where it cannot run (nested PVM)
// hangs forever rather than failing.
const probeTimeout = 4 * time.Second

type platformCache struct {
	Runsc    string            `json:"runsc"`
	Kernel   string            `json:"kernel"`
	Platform string            `json:"platform"`
	Rejected map[string]string `json:"rejected"`
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// choosePlatform returns Options.Platform, or the fastest platform that runs
// a trial sandbox here. The answer is cached in the state dir per runsc
// version and kernel, because a hanging kvm trial costs seconds.
func (r *Runtime) choosePlatform(ctx context.Context) (string, map[string]string, error) {
	if r.opts.Platform != "" {
		return r.opts.Platform, nil, nil
	}
	cachePath := filepath.Join(r.StateDir(), "platform.json")
	var c platformCache
	if b, err := os.ReadFile(cachePath); err == nil && json.Unmarshal(b, &c) == nil &&
		c.Runsc == r.version && c.Kernel == kernelRelease() && c.Platform != "" {
		return c.Platform, c.Rejected, nil
	}
	supported, err := r.runscCommandOutput(ctx, "help", "platforms")
	if err != nil {
		return "", nil, fmt.Errorf("list gVisor platforms: %w", err)
	}
	listed := map[string]bool{}
	for _, f := range strings.Fields(supported) {
		listed[f] = true
	}
	rejected := map[string]string{}
	chosen := ""
	for _, p := range platformOrder {
		if !listed[p] {
			rejected[p] = "not supported by this runsc"
			continue
		}
		if p == "kvm" {
			if _, err := os.Stat("/dev/kvm"); err != nil {
				rejected[p] = "no /dev/kvm"
				continue
			}
		}
		if err := r.trial(ctx, p); err != nil {
			rejected[p] = err.Error()
			r.log.Info("gVisor platform rejected", "platform", p, "reason", err)
			continue
		}
		chosen = p
		break
	}
	if chosen == "" {
		return "", rejected, fmt.Errorf("no gVisor platform works on this host: %v", rejected)
	}
	c = platformCache{Runsc: r.version, Kernel: kernelRelease(), Platform: chosen, Rejected: rejected}
	if b, err := json.Marshal(c); err == nil {
		_ = os.WriteFile(cachePath, b, 0o600)
	}
	return chosen, rejected, nil
}

func (r *Runtime) runscCommandOutput(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, r.runsc, args...).CombinedOutput()
	return string(out), err
}

// trial runs `sandbox-agent version` in a throwaway sandbox on platform p.
func (r *Runtime) trial(ctx context.Context, p string) error {
	dir, err := os.MkdirTemp(r.StateDir(), "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "runsc")
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{root, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	agent, err := os.ReadFile(filepath.Join(r.StateDir(), "bin", "sandbox-agent"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "sandbox-agent"), agent, 0o755); err != nil {
		return err
	}
	spec := &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{Args: []string{"/sandbox-agent", "version"}, Cwd: "/", Env: []string{"PATH=/"}},
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux:   &specs.Linux{Namespaces: namespaces()},
	}
	if err := writeSpec(dir, spec); err != nil {
		return err
	}
	cid := "probe-" + p + "-" + host.NewCID("")
	tctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.Command(r.runsc, "--root", root, "--platform", p, "--network", "none", "--ignore-cgroups", "run", "--bundle", dir, cid)
	// Its own process group, so a hung trial's sandbox and gofer die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
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
	_ = exec.Command(r.runsc, "--root", root, "delete", "--force", cid).Run()
	if runErr != nil {
		return runErr
	}
	if !strings.Contains(out.String(), "sandbox-agent") {
		return errors.New("trial sandbox printed nothing")
	}
	return nil
}
