package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// tcgCacheMiB is TCG's translation cache: QEMU's default for system
// emulation is a quarter of the host's memory (up to 1 GiB) per VM, which
// would make the host cgroup's backstop meaningless.
const tcgCacheMiB = 256

// Paths inside the jail (see jail.go).
const (
	jailKernel  = "/boot/vmlinux"
	jailInitrd  = "/boot/initrd.cpio"
	jailBase    = "/disk/base.ext4"
	jailLayer   = "/disk/layer.ext4"
	jailQMP     = "/run/qmp.sock"
	jailAgent   = "/run/agent.sock"
	jailConsole = "/run/console.sock"
	agentPort   = "sandboxd"
)

// vmConfig is one QEMU invocation.
type vmConfig struct {
	Accel    string `json:"accel"` // "kvm" or "tcg"
	MemMiB   int64  `json:"mem_mib"`
	VCPUs    int    `json:"vcpus"`
	TSCKHz   uint64 `json:"tsc_khz,omitempty"`
	Hostname string `json:"hostname"`
	Pids     int64  `json:"pids"`   // pids.max of the sandbox cgroup in the guest
	Memory   int64  `json:"memory"` // memory.max of the sandbox cgroup in the guest
	// NIC: the VM has a virtio-net device (network.go); false only for
	// VMs an older sandboxd made, whose saved memory has none.
	NIC bool `json:"nic,omitempty"`
	// Volumes are the volume images the VM has as disks, in order: each
	// is a virtio-blk disk of serial sandboxd-vol-<i> that vm-init mounts
	// at its path (sandboxd.vol.<i> on the kernel command line).
	Volumes  []runtime.VolumeMount `json:"volumes,omitempty"`
	volFDs   [][]int               // each volume's image as QEMU's fds (read-only, and read-write for a writer)
	incoming bool                  // restore from a memory snapshot (migrate-incoming)
	tapFD    int                   // the NIC's tap queue as QEMU's fd; 0: not wired
	mac      string                // the NIC's hardware address, with a tap
}

// kernelCmdline is the guest kernel's command line. The sandboxd.*
// parameters are read by the agent's vm-init.
func (c vmConfig) kernelCmdline() string {
	args := []string{
		"console=ttyS0", "loglevel=4", "reboot=t", "panic=-1", "rdinit=/sandbox-agent",
		// No legacy timer probing: the clock is the TSC (or kvm-clock).
		"no_timer_check", "tsc=reliable",
		"random.trust_cpu=on",
		"sandboxd.port=" + agentPort,
		"sandboxd.hostname=" + c.Hostname,
		"sandboxd.pids=" + strconv.FormatInt(c.Pids, 10),
		"sandboxd.memory=" + strconv.FormatInt(c.Memory, 10),
	}
	for i, v := range c.Volumes {
		mode := "rw"
		if v.ReadOnly {
			mode = "ro"
		}
		// runtime.CheckVolumePath keeps spaces and quotes out of it.
		args = append(args, fmt.Sprintf("sandboxd.vol.%d=%s:%s", i, mode, v.Path))
	}
	if c.Accel == "tcg" {
		// TCG does not speculate: the mitigations would only cost, and
		// page-table isolation would flush QEMU's soft TLB on every
		// system call.
		args = append(args, "mitigations=off")
		if c.TSCKHz > 0 {
			args = append(args, "tsc_early_khz="+strconv.FormatUint(c.TSCKHz, 10))
		}
	}
	// A bare word the kernel does not know is passed to init as an
	// argument; "--" cannot be used, since QEMU appends the virtio-mmio
	// device list after everything given here.
	return strings.Join(append(args, "vm-init"), " ")
}

// qemuArgs is the QEMU command line, with paths inside the jail.
func (c vmConfig) qemuArgs() []string {
	accel := "kvm"
	cpu := "host"
	if c.Accel == "tcg" {
		accel = fmt.Sprintf("tcg,thread=multi,tb-size=%d", tcgCacheMiB)
		cpu = "max"
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-M", "microvm,acpi=off,x-option-roms=off",
		"-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(c.VCPUs), "-m", strconv.FormatInt(c.MemMiB, 10) + "M",
		"-kernel", jailKernel, "-initrd", jailInitrd, "-append", c.kernelCmdline(),
		"-drive", "id=base,file=" + jailBase + ",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=base,serial=sandboxd-base",
		"-drive", "id=layer,file=" + jailLayer + ",format=raw,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=layer,serial=sandboxd-layer",
	}
	for i, fds := range c.volFDs {
		// The image is opened by sandboxd and handed over: QEMU's uid
		// has no right to the file itself. The fd set is volume i's.
		set := i + 1
		for _, fd := range fds {
			args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d", fd, set))
		}
		drive := fmt.Sprintf("id=vol%d,file=/dev/fdset/%d,format=raw,if=none", i, set)
		if c.Volumes[i].ReadOnly {
			drive += ",readonly=on"
		}
		args = append(args, "-drive", drive, "-device", fmt.Sprintf("virtio-blk-device,drive=vol%d,serial=sandboxd-vol-%d", i, i))
	}
	args = append(args,
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+jailAgent+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentPort,
		"-object", "rng-random,id=rng,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng",
	)
	if c.NIC {
		netdev, mac := "hubport,id=net0,hubid=0", unwiredMAC
		if c.tapFD > 0 {
			netdev, mac = "tap,id=net0,fd="+strconv.Itoa(c.tapFD), c.mac
		}
		args = append(args, "-netdev", netdev, "-device", "virtio-net-device,netdev=net0,mac="+mac)
	}
	args = append(args,
		// Read by sandboxd into a capped log (logs.go); not a file the
		// guest could grow without bound.
		"-chardev", "socket,id=console,path="+jailConsole+",server=on,wait=off",
		"-serial", "chardev:console",
		"-qmp", "unix:"+jailQMP+",server=on,wait=off",
		"-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-msg", "timestamp=on",
	)
	if c.incoming {
		// The state comes later through QMP (migrate-incoming), once the
		// host is connected to the agent's port: loading it then leaves
		// the port's connected state as it was saved, and the restored
		// agent never sees its host go away.
		args = append(args, "-incoming", "defer")
	}
	return args
}

// launch starts QEMU in the jail: chrooted into jail, as uid, in new
// namespaces, in its own session (it outlives sandboxd), inside the host
// cgroup (at clone time on cgroup v2, right after on v1 — the VM is
// started with -S and runs only once the caller says cont). logf receives
// QEMU's own messages; extra are passed from fd 3 on.
func launch(qemu, jail string, uid int, cg hostCgroup, cfg vmConfig, logf *os.File, extra ...*os.File) (*os.Process, error) {
	cmd := exec.Command(qemu, cfg.qemuArgs()...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin"}
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     jail,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}},
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWNET,
		Setsid:     true,
	}
	dir, err := cg.openV2()
	if err != nil {
		return nil, err
	}
	if dir != nil {
		defer dir.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dir.Fd())
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	if dir == nil {
		if err := cg.addProc(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
			return nil, err
		}
	}
	return cmd.Process, nil
}

// procStart is a process's start time in clock ticks since boot (field 22
// of /proc/<pid>/stat), which tells a process from a later one that reused
// its pid.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("bad stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, os.ErrNotExist // a zombie is gone for our purposes
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive says whether the process pid that started at start still runs.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	s, err := procStart(pid)
	return err == nil && s == start
}

// killWait kills the process and waits up to d for it to disappear.
func killWait(pid int, start uint64, d time.Duration) error {
	if !alive(pid, start) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(d)
	for alive(pid, start) {
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu pid %d did not exit", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// waitExit returns a channel closed when the process exits (its pidfd
// becomes readable), or never if ctx ends first. It works for processes
// that are not our children, such as a QEMU started by an earlier sandboxd.
func waitExit(ctx context.Context, pid int, start uint64) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil || !alive(pid, start) {
			if err == nil {
				unix.Close(fd)
			}
			close(ch)
			return
		}
		defer unix.Close(fd)
		for ctx.Err() == nil {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(p, 500)
			if (err != nil && !errors.Is(err, unix.EINTR)) || n > 0 {
				close(ch)
				return
			}
		}
	}()
	return ch
}

// consoleTail is the end of a VM's console log, for error messages.
func consoleTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
