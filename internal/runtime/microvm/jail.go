package microvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/cgroup"
	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The jail, modelled on Firecracker's jailer: QEMU runs as an unprivileged
// uid of its own (one per sandbox, from Options.UIDBase), chrooted into the
// sandbox's jail directory, in new mount, PID, IPC, UTS and network
// namespaces, under -sandbox (seccomp: no obsolete calls, no privilege
// changes, no spawning, no resource control), inside a host cgroup with the
// sandbox's limits. What the jail holds:
//
//	jail/            root-owned, 0711: QEMU can traverse, not list
//	    usr/         read-only bind mount of the host's /usr (QEMU, its
//	                 libraries and firmware); lib, lib64, bin, sbin as the host has them
//	    etc/ld.so.cache  a copy, so the loader finds the libraries
//	    dev/         a small tmpfs: null, zero, random, urandom, and kvm with KVM
//	    boot/        the kernel and initramfs (hard links, root-owned, read-only)
//	    disk/        base.ext4 (hard link or read-only bind, root-owned, 0444) and
//	                 layer.ext4 (owned by the sandbox's uid)
//	    run/         owned by the sandbox's uid: qmp.sock, agent.sock, console.sock
//
// Nothing else of the host is visible: not the other sandboxes, not the
// state directory, not /proc.

// jailDirs are the top-level host directories QEMU needs besides /usr; on a
// merged-/usr host they are symlinks and are copied as such.
var jailDirs = []string{"lib", "lib64", "bin", "sbin"}

// makeJail builds the jail tree at dir for uid.
func makeJail(dir string, uid int, kvm bool) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	if err := bindReadOnly("/usr", filepath.Join(dir, "usr")); err != nil {
		return err
	}
	for _, d := range jailDirs {
		host := "/" + d
		fi, err := os.Lstat(host)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink(host)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, filepath.Join(dir, d)); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			continue
		}
		if err := bindReadOnly(host, filepath.Join(dir, d)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		return err
	}
	if b, err := os.ReadFile("/etc/ld.so.cache"); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "etc", "ld.so.cache"), b, 0o644); err != nil {
			return err
		}
	}
	devDir := filepath.Join(dir, "dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", devDir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("mount jail /dev: %w", err)
	}
	_ = unix.Mount("", devDir, "", unix.MS_PRIVATE, "")
	nodes := []struct {
		name         string
		major, minor uint32
		mode         uint32
		owner        int
	}{
		{"null", 1, 3, 0o666, 0}, {"zero", 1, 5, 0o666, 0}, {"random", 1, 8, 0o666, 0}, {"urandom", 1, 9, 0o666, 0},
	}
	if kvm {
		nodes = append(nodes, struct {
			name         string
			major, minor uint32
			mode         uint32
			owner        int
		}{"kvm", 10, 232, 0o600, uid})
	}
	for _, n := range nodes {
		p := filepath.Join(devDir, n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|n.mode, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("jail /dev/%s: %w", n.name, err)
		}
		if err := os.Chmod(p, os.FileMode(n.mode)); err != nil {
			return err
		}
		if err := os.Chown(p, n.owner, n.owner); err != nil {
			return err
		}
	}
	for _, d := range []string{"boot", "disk"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return err
		}
	}
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		return err
	}
	return os.Chown(run, uid, uid)
}

// bindReadOnly bind-mounts src at dst read-only, without device nodes or
// set-uid programs, and private (nothing propagates in or out).
func bindReadOnly(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o444); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	_ = unix.Mount("", dst, "", unix.MS_PRIVATE|unix.MS_REC, "")
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(dst, unix.MNT_DETACH)
		return fmt.Errorf("make %s read-only: %w", dst, err)
	}
	return nil
}

// linkReadOnly makes src visible at dst inside a jail: a hard link when both
// are on one file system (no mount to clean up), else a read-only bind
// mount. src must be root-owned and not writable by the jail's uid.
func linkReadOnly(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	} else if !errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("link %s: %w", src, err)
	}
	return bindReadOnly(src, dst)
}

// unmountAll unmounts everything at or below dir, deepest first, detaching
// what stays busy; it reports what could not be unmounted.
func unmountAll(dir string) error {
	mounts, _ := mountinfo.Under(dir)
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var errs []error
	for _, m := range mounts {
		var err error
		for i := 0; i < 50; i++ {
			if err = unix.Unmount(m, 0); err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			if derr := unix.Unmount(m, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

// hostCgroup is the host cgroup holding one sandbox's QEMU. internal/cgroup
// reads it; creating and limiting it is this backend's job, since no OCI
// runtime stands in between.
type hostCgroup struct {
	cgroup.Group
}

// v1Controllers are the cgroup v1 hierarchies a sandbox gets a group in.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids"}

// cgroupLimits are the host-side limits of one VM.
type cgroupLimits struct {
	memory int64 // bytes: guest memory plus QEMU's own
	cpus   float64
	pids   int64
}

func newHostCgroup(path string) hostCgroup { return hostCgroup{cgroup.New(path)} }

// create makes the group (and its parent) and sets the limits.
func (g hostCgroup) create(l cgroupLimits) error {
	write := func(dir, file, v string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			return fmt.Errorf("cgroup %s/%s=%s: %w", dir, file, v, err)
		}
		return nil
	}
	const period = 100000
	quota := int64(l.cpus * period)
	if g.Version == cgroup.V2 {
		root := cgroup.Root
		parent := filepath.Dir(filepath.Join(root, g.Path))
		for _, d := range []string{root, parent} {
			if d != root {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			if err := write(d, "cgroup.subtree_control", "+memory +pids +cpu"); err != nil {
				return err
			}
		}
		dir := filepath.Join(root, g.Path)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := write(dir, "memory.max", strconv.FormatInt(l.memory, 10)); err != nil {
			return err
		}
		_ = write(dir, "memory.swap.max", "0")
		if err := write(dir, "pids.max", strconv.FormatInt(l.pids, 10)); err != nil {
			return err
		}
		if quota > 0 {
			return write(dir, "cpu.max", fmt.Sprintf("%d %d", quota, period))
		}
		return nil
	}
	for _, c := range v1Controllers {
		base := filepath.Join(cgroup.Root, c)
		if _, err := os.Stat(base); err != nil {
			continue
		}
		dir := filepath.Join(base, g.Path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var err error
		switch c {
		case "memory":
			err = write(dir, "memory.limit_in_bytes", strconv.FormatInt(l.memory, 10))
		case "pids":
			err = write(dir, "pids.max", strconv.FormatInt(l.pids, 10))
		case "cpu":
			if quota > 0 {
				if err = write(dir, "cpu.cfs_period_us", strconv.Itoa(period)); err == nil {
					err = write(dir, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// openV2 opens the group's directory for CLONE_INTO_CGROUP; nil on v1.
func (g hostCgroup) openV2() (*os.File, error) {
	if g.Version != cgroup.V2 {
		return nil, nil
	}
	return os.OpenFile(filepath.Join(cgroup.Root, g.Path), os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// addProc moves pid into the group (v1; v2 places QEMU at clone time).
func (g hostCgroup) addProc(pid int) error {
	for _, d := range g.Dirs() {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move QEMU into %s: %w", d, err)
		}
	}
	return nil
}

// vmLimits derives a VM's shape from the sandbox's limits: the guest gets
// the sandbox's memory plus room for its kernel and agent (the sandbox's
// processes are held to the limit by a cgroup inside), and the host cgroup
// adds QEMU's own memory, including TCG's translation cache, as a backstop.
func vmLimits(l runtime.Limits, tcg bool) (guestMiB int64, vcpus int, host cgroupLimits) {
	const mib = 1 << 20
	limitMiB := (l.MemoryBytes + mib - 1) / mib
	// Kernel, agent, page tables and struct pages (1/64 of memory).
	guestMiB = limitMiB + 96 + limitMiB/64
	vcpus = int(l.CPUs + 0.999)
	if vcpus < 1 {
		vcpus = 1
	}
	overhead := int64(192)
	if tcg {
		overhead += tcgCacheMiB
	}
	host = cgroupLimits{memory: (guestMiB + overhead) * mib, cpus: l.CPUs, pids: 256 + int64(vcpus)}
	return guestMiB, vcpus, host
}
