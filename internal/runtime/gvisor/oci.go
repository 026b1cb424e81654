package gvisor

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The subset of the OCI runtime spec (1.0) that sandboxd's bundles use. The
// official Go types are not among the modules this project can fetch, and
// this small subset is all runsc needs from us.
type ociSpec struct {
	Version  string            `json:"ociVersion"`
	Process  ociProcess        `json:"process"`
	Root     ociRoot           `json:"root"`
	Hostname string            `json:"hostname,omitempty"`
	Mounts   []ociMount        `json:"mounts"`
	Linux    ociLinux          `json:"linux"`
	Annots   map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	Terminal     bool        `json:"terminal"`
	User         ociUser     `json:"user"`
	Args         []string    `json:"args"`
	Env          []string    `json:"env"`
	Cwd          string      `json:"cwd"`
	Capabilities ociCaps     `json:"capabilities"`
	Rlimits      []ociRlimit `json:"rlimits,omitempty"`
	NoNewPrivs   bool        `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
	Resources   *ociResources  `json:"resources,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"` // join this namespace instead of making one
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociMemory struct {
	Limit *int64 `json:"limit,omitempty"`
}

type ociCPU struct {
	Quota  *int64  `json:"quota,omitempty"`
	Period *uint64 `json:"period,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// capabilities are Docker's default set: enough for package managers,
// chown and su inside, without CAP_SYS_ADMIN or CAP_SYS_RESOURCE (so nothing
// inside can raise the process limit the bundle sets).
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// In-sandbox paths of what the runtime mounts. /run is a tmpfs, as on any
// Linux system, so these mount points never reach the writable layer.
const (
	guestBinDir    = "/run/sandboxd/bin"
	guestSockDir   = "/run/sandboxd/sock"
	guestAgent     = guestBinDir + "/sandbox-agent"
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
// only a generous backstop against a runaway sentry.
func hardLimits(l runtime.Limits) (memHard, pidsHard int64) {
	if l.MemoryBytes > 0 {
		memHard = l.MemoryBytes + max(128<<20, l.MemoryBytes/4)
	}
	if l.Pids > 0 {
		pidsHard = l.Pids*64 + 4096
	}
	return memHard, pidsHard
}

// buildSpec writes the OCI bundle config for sandbox s.
// preload, when not empty, is the host file mounted as /etc/ld.so.preload
// (see statxcompat.go).
func buildSpec(s *meta, rootfs, binDir, sockDir, hostsFile, preload string) ociSpec {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	proc := ociProcess{
		Args:         []string{guestAgent, "--socket", guestSocket},
		Env:          env,
		Cwd:          "/",
		Capabilities: ociCaps{Bounding: capabilities, Effective: capabilities, Permitted: capabilities},
		Rlimits:      []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
	}
	if s.Limits.Pids > 0 {
		n := uint64(s.Limits.Pids)
		proc.Rlimits = append(proc.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	res := &ociResources{}
	memHard, pidsHard := hardLimits(s.Limits)
	if memHard > 0 {
		res.Memory = &ociMemory{Limit: &memHard}
	}
	if s.Limits.CPUs > 0 {
		period := uint64(100000)
		quota := int64(math.Ceil(s.Limits.CPUs * float64(period)))
		res.CPU = &ociCPU{Quota: &quota, Period: &period}
	}
	if pidsHard > 0 {
		res.Pids = &ociPids{Limit: pidsHard}
	}
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755"}},
		{Destination: guestBinDir, Type: "bind", Source: binDir, Options: []string{"rbind", "ro"}},
		{Destination: guestSockDir, Type: "bind", Source: sockDir, Options: []string{"rbind", "ro"}},
		{Destination: guestHostsFile, Type: "bind", Source: hostsFile, Options: []string{"rbind", "ro"}},
	}
	if preload != "" {
		mounts = append(mounts, ociMount{Destination: guestPreload, Type: "bind", Source: preload, Options: []string{"rbind", "ro"}})
	}
	return ociSpec{
		Version:  "1.0.2",
		Process:  proc,
		Root:     ociRoot{Path: rootfs},
		Hostname: s.Hostname,
		Mounts:   mounts,
		Linux: ociLinux{
			Namespaces:  []ociNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			CgroupsPath: s.CgroupPath,
			Resources:   res,
		},
	}
}

func writeSpec(dir string, spec ociSpec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write bundle config: %w", err)
	}
	return nil
}
