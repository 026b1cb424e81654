package gvisor

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Bundles are written with the OCI runtime spec's own Go types (specs-go),
// which runsc itself reads.

// capabilities are Docker's default set: enough for package managers,
// chown and su inside, without CAP_SYS_ADMIN or CAP_SYS_RESOURCE (so nothing
// inside can raise the process limit the bundle sets).
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// In-sandbox paths of what the runtime mounts. /run is a tmpfs, as on any
// Linux system, so these mount points never reach the writable layer; nor
// does guestSudo's, which the sentry keeps over the image's file.
const (
	guestBinDir    = "/run/sandboxd/bin"
	guestSockDir   = "/run/sandboxd/sock"
	guestAgent     = guestBinDir + "/sandbox-agent"
	guestSudo      = "/usr/bin/sudo"
	guestSocket    = guestSockDir + "/agent.sock"
	guestHostsFile = "/etc/hosts"
)

// hardLimits turns the sandbox's limits into the host cgroup's: the memory
// guard fires at MemoryBytes (the agent then kills the biggest process
// inside), and the cgroup's hard cap sits above it so only a runaway that
// outpaces the guard takes the whole sandbox down. The process limit is
// enforced inside (RLIMIT_NPROC); on the ptrace platform gVisor needs host
// tasks per process and per sentry thread (a fork bomb capped at 64
// processes inside drove ≈ 1,500 host tasks in 8 s), so the host pids cap is
// a generous backstop against a runaway sentry — but never more than
// ceiling, the sandbox's share of the node's tasks (see taskCeiling).
func hardLimits(l runtime.Limits, ceiling int64) (memHard, pidsHard int64) {
	if l.MemoryBytes > 0 {
		memHard = l.MemoryBytes + max(128<<20, l.MemoryBytes/4)
	}
	if l.Pids > 0 {
		pidsHard = l.Pids*64 + 4096
		if ceiling > 0 {
			pidsHard = min(pidsHard, ceiling)
		}
	}
	return memHard, pidsHard
}

// taskCeiling is the most host tasks (processes and threads) one sandbox's
// cgroup may hold on a host whose kernel allows pidMax pids and threadsMax
// threads in all, running at most sandboxes sandboxes (0: not known): its
// equal share of the node, but at least a working minimum (4096, or a
// quarter of the host on a small one) and never more than a quarter of the
// host, so that one runaway sandbox cannot take the host's last pids.
// 0 means nothing is known (no cap beyond the limits' own).
func taskCeiling(pidMax, threadsMax int64, sandboxes int) int64 {
	budget := pidMax
	if threadsMax > 0 && (budget <= 0 || threadsMax < budget) {
		budget = threadsMax
	}
	if budget <= 0 {
		return 0
	}
	quarter := budget / 4
	share := quarter
	if sandboxes > 0 {
		share = budget / int64(sandboxes)
	}
	return min(max(share, min(4096, quarter)), quarter)
}

// hostTaskCeiling is taskCeiling for this host.
func hostTaskCeiling(sandboxes int) int64 {
	read := func(path string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v
	}
	return taskCeiling(read("/proc/sys/kernel/pid_max"), read("/proc/sys/kernel/threads-max"), sandboxes)
}

// buildSpec writes the OCI bundle config for sandbox s.
// preload, when not empty, is the host file mounted as /etc/ld.so.preload
// (see statxcompat.go).
// pidsCeiling caps the host pids backstop (see hardLimits; 0: no cap).
func buildSpec(s *meta, rootfs, binDir, sockDir, hostsFile, preload string, pidsCeiling int64) *specs.Spec {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	if s.AgentSecret != "" {
		// The agent (PID 1) takes it out of its environment and memory at
		// start, before any other process exists in the sandbox; processes
		// it starts get an environment of their own.
		env = append(env, guest.SecretEnv+"="+s.AgentSecret)
	}
	args := []string{guestAgent, "--socket", guestSocket}
	if s.AgentTTYSignals {
		args = append(args, "--tty-signals")
	}
	proc := &specs.Process{
		Args:         args,
		Env:          env,
		Cwd:          "/",
		Capabilities: &specs.LinuxCapabilities{Bounding: capabilities, Effective: capabilities, Permitted: capabilities},
		Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
	}
	if s.Limits.Pids > 0 {
		n := uint64(s.Limits.Pids)
		proc.Rlimits = append(proc.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	res := &specs.LinuxResources{}
	memHard, pidsHard := hardLimits(s.Limits, pidsCeiling)
	if memHard > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &memHard}
	}
	if s.Limits.CPUs > 0 {
		period := uint64(100000)
		quota := int64(math.Ceil(s.Limits.CPUs * float64(period)))
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if pidsHard > 0 {
		res.Pids = &specs.LinuxPids{Limit: &pidsHard}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755"}},
		tmpMount(s.Limits.MemoryBytes),
		{Destination: guestBinDir, Type: "bind", Source: binDir, Options: []string{"rbind", "ro"}},
		{Destination: guestSockDir, Type: "bind", Source: sockDir, Options: []string{"rbind", "ro"}},
		{Destination: guestHostsFile, Type: "bind", Source: hostsFile, Options: []string{"rbind", "ro"}},
	}
	if preload != "" {
		mounts = append(mounts, specs.Mount{Destination: guestPreload, Type: "bind", Source: preload, Options: []string{"rbind", "ro"}})
	}
	// gVisor honours no setuid bit: the image's sudo would refuse to run,
	// so the agent binary takes its place and asks the agent (PID 1) to
	// run the command for what the image's sudoers grant (agent.SudoMain).
	if fi, err := os.Lstat(filepath.Join(rootfs, guestSudo)); err == nil && fi.Mode().IsRegular() {
		mounts = append(mounts, specs.Mount{Destination: guestSudo, Type: "bind", Source: filepath.Join(binDir, filepath.Base(guestAgent)), Options: []string{"rbind", "ro"}})
	}
	return &specs.Spec{
		Version:  "1.0.2",
		Process:  proc,
		Root:     &specs.Root{Path: rootfs},
		Hostname: s.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces:  namespaces(),
			CgroupsPath: s.CgroupPath,
			Resources:   res,
		},
	}
}

// tmpMount is /tmp: memory, a tmpfs, as runsc mounts it anyway when the
// bundle names none, but sized. runsc's own has no size: df showed
// exabytes free while its pages count against the sandbox's memory limit,
// so a large write was killed for memory instead of failing with ENOSPC.
// It gets half of the memory limit, as Linux sizes a tmpfs by default, so
// that df tells the truth and a full /tmp leaves the processes memory to
// report it. Without a memory limit it is runsc's unsized one.
func tmpMount(memoryBytes int64) specs.Mount {
	opts := []string{"nosuid", "nodev", "mode=1777"}
	if memoryBytes > 0 {
		opts = append(opts, fmt.Sprintf("size=%dk", max(1, memoryBytes/2>>10)))
	}
	return specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: opts}
}

// namespaces are the namespaces of a bundle: all of its own.
func namespaces() []specs.LinuxNamespace {
	return []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}}
}

func writeSpec(dir string, spec *specs.Spec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write bundle config: %w", err)
	}
	return nil
}
