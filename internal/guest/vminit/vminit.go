// Package vminit is the sandbox agent's microVM modes, vm-init and vm-agent:
// cmd/sandbox-agent dispatches to Main and stays thin. The runtime/microvm
// backend boots a minimal kernel with that binary as /sandbox-agent in an
// uncompressed initramfs and runs it as the kernel's init:
// `rdinit=/sandbox-agent -- vm-init`.
//
// vm-init (PID 1 of the VM) builds the sandbox's root file system — the
// base image disk (read-only ext4, virtio-blk serial "sandboxd-base") and
// the writable layer disk (ext4, serial "sandboxd-layer", holding lower-N/
// restored layers, upper/ and work/) under overlayfs — moves into it, sets
// the hostname, loopback and the sandbox cgroup (memory and pids limits from
// the kernel command line), and starts vm-agent in a new PID and mount
// namespace. The agent is PID 1 there: the sandbox's processes see only
// themselves and the agent in /proc, never the kernel's threads. When the
// agent dies, vm-init reboots, and QEMU (-no-reboot) exits: the sandbox
// stops.
//
// vm-agent serves the guest protocol on the virtio-serial port named
// "sandboxd". A port can be opened only once; when the host side goes away
// (sandboxd restarts) reads return EOF, the agent closes the port, waits for
// the host to connect again and speaks a fresh handshake.
package vminit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
)

// Kernel command line parameters vm-init reads (sandboxd.*).
const (
	paramHostname = "sandboxd.hostname"
	paramPids     = "sandboxd.pids"   // pids.max of the sandbox cgroup
	paramMemory   = "sandboxd.memory" // memory.max of the sandbox cgroup, bytes
	paramProbe    = "sandboxd.probe"  // print probeMarker and power off
	paramPort     = "sandboxd.port"   // virtio-serial port name
	probeMarker   = "sandboxd-probe-ok"
	sandboxCgroup = "/sys/fs/cgroup/sandbox"
	newRoot       = "/newroot"
	upperFD       = 3 // the writable layer's upper dir, passed to vm-agent
)

// Modes are the sandbox-agent subcommands Main runs.
const (
	ModeInit  = "vm-init"  // PID 1 of the VM
	ModeAgent = "vm-agent" // the agent, started by vm-init
)

// Main runs a microVM mode (ModeInit or ModeAgent) of the agent binary at
// this version, with the mode's arguments, and returns the exit status.
func Main(mode, version string, args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", version, "mode", mode)
	var err error
	switch mode {
	case ModeInit:
		err = vmInit(log)
	case ModeAgent:
		err = vmAgent(log, version, args)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		log.Error("sandbox-agent failed", "err", err)
		if os.Getpid() == 1 {
			powerOff()
		}
		return 1
	}
	return 0
}

// powerOff ends the VM: with reboot=t the kernel resets through a triple
// fault, and QEMU, started with -no-reboot, exits.
func powerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", target, err)
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
	}
	return nil
}

// cmdline parses the sandboxd.* parameters of the kernel command line.
func cmdline() (map[string]string, error) {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, err
	}
	return parseCmdline(string(b)), nil
}

// parseCmdline returns the sandboxd.* parameters of a kernel command line,
// up to the "--" that starts init's own arguments.
func parseCmdline(line string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		if f == "--" {
			break
		}
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "sandboxd.") {
			out[k] = v
		}
	}
	return out
}

// findDisk returns the /dev node of the virtio-blk disk with this serial.
func findDisk(serial string) (string, error) {
	ents, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + filepath.Base(filepath.Dir(p)), nil
		}
	}
	return "", fmt.Errorf("no virtio disk with serial %q", serial)
}

// findPort returns the /dev node of the virtio-serial port with this name
// (no udev here to make /dev/virtio-ports/NAME).
func findPort(name string) (string, error) {
	ents, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(p)), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q", name)
}

func vmInit(log *slog.Logger) error {
	if os.Getpid() != 1 {
		return errors.New("vm-init must be the kernel's init")
	}
	const nosuid = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := mount("proc", "/proc", "proc", nosuid, ""); err != nil {
		return err
	}
	params, err := cmdline()
	if err != nil {
		return err
	}
	if params[paramProbe] != "" {
		fmt.Println(probeMarker)
		powerOff()
	}
	if err := mount("sysfs", "/sys", "sysfs", nosuid, ""); err != nil {
		return err
	}
	if err := mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return err
	}
	base, err := findDisk("sandboxd-base")
	if err != nil {
		return err
	}
	layer, err := findDisk("sandboxd-layer")
	if err != nil {
		return err
	}
	if err := mount(base, "/base", "ext4", unix.MS_RDONLY, ""); err != nil {
		return err
	}
	if err := mount(layer, "/layer", "ext4", unix.MS_NOATIME, ""); err != nil {
		return err
	}
	lowerDirs, _ := filepath.Glob("/layer/lower-*")
	sortLowers(lowerDirs)
	lowers := append(lowerDirs, "/base")
	for _, d := range []string{"/layer/upper", "/layer/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The upper directory alone must be the snapshot: no index, redirects
	// or metacopy, which would point into the lowers.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=/layer/upper,workdir=/layer/work,index=off,redirect_dir=off,metacopy=off",
		strings.Join(lowers, ":"))
	if err := mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return err
	}
	upper, err := unix.Open("/layer/upper", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("open upper dir: %w", err)
	}
	// sandboxd.internal resolves to the agent's forwarder on loopback.
	hostname := params[paramHostname]
	if hostname == "" {
		hostname = "sandbox"
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost sandboxd.internal\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname)
	if err := bindOverRoot(log, "/etc/hosts", []byte(hosts)); err != nil {
		return err
	}
	// The agent writes the sandbox network's nameservers here
	// (ConfigureNetwork); until then it is the image's own.
	resolv, _ := os.ReadFile(newRoot + "/etc/resolv.conf")
	if err := bindOverRoot(log, "/etc/resolv.conf", resolv); err != nil {
		return err
	}
	// An image need not have its mount points (one built FROM scratch has
	// none): they are made in the writable layer.
	if err := mountPoints(newRoot, "/dev", "/proc", "/sys"); err != nil {
		return err
	}
	if err := unix.Mount("/dev", newRoot+"/dev", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /dev: %w", err)
	}
	if err := mount("devpts", newRoot+"/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := mount("tmpfs", newRoot+"/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := mountTmp(params[paramMemory]); err != nil {
		return err
	}
	if err := mountVolumes(log, params); err != nil {
		return err
	}
	// vm-init keeps the whole VM's /proc; vm-agent mounts its own PID
	// namespace's over it.
	if err := unix.Mount("/proc", newRoot+"/proc", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /proc: %w", err)
	}
	if err := unix.Mount("/sys", newRoot+"/sys", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /sys: %w", err)
	}
	if err := mount("cgroup2", newRoot+"/sys/fs/cgroup", "cgroup2", nosuid, ""); err != nil {
		return err
	}
	// Switch root: the overlay becomes /, the initramfs stays underneath.
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if err := setupCgroup(params); err != nil {
		return err
	}
	port := params[paramPort]
	if port == "" {
		port = "sandboxd"
	}
	log.Info("root file system ready", "lowers", len(lowerDirs), "uptime", uptime())
	return supervise(log, upper, port)
}

// mountVolumes mounts the sandbox's volumes (sandboxd.vol.<i>=<rw|ro>:<path>,
// disk serial sandboxd-vol-<i>) in the new root at their paths, made in
// the writable layer when missing and resolved inside the new root (a
// link in the image cannot send a mount outside it), nosuid and nodev. A
// read-write one grows to its disk's size (the volume may have been
// resized since its file system was made); a read-only one is mounted
// without replaying its journal, which it could not write.
func mountVolumes(log *slog.Logger, params map[string]string) error {
	for i := 0; ; i++ {
		v, ok := params[fmt.Sprintf("sandboxd.vol.%d", i)]
		if !ok {
			return nil
		}
		mode, path, _ := strings.Cut(v, ":")
		dev, err := findDisk(fmt.Sprintf("sandboxd-vol-%d", i))
		if err != nil {
			return err
		}
		dev = newRoot + dev // /dev has moved into the new root by now
		target, err := securejoin.SecureJoin(newRoot, path)
		if err != nil {
			return fmt.Errorf("volume at %s: %w", path, err)
		}
		flags, data := uintptr(unix.MS_NOSUID|unix.MS_NODEV), ""
		if mode == "ro" {
			flags |= unix.MS_RDONLY
			data = "noload"
		}
		if err := mount(dev, target, "ext4", flags, data); err != nil {
			return fmt.Errorf("volume at %s: %w", path, err)
		}
		if mode != "ro" {
			if err := growToDisk(dev, target); err != nil {
				// The volume is usable at its old size: say so, go on.
				log.Warn("grow volume", "path", path, "err", err)
			}
		}
	}
}

// growToDisk grows the ext4 file system on dev, mounted at dir, to the
// disk's size.
func growToDisk(dev, dir string) error {
	f, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return fmt.Errorf("size of %s: %w", dev, err)
	}
	return ext4.Grow(dir, int64(size))
}

// mountPoints makes each of dirs in root a directory unless it is one. A
// mount point that is something else in the image (a symlink, which would
// resolve outside root before the switch) is an error naming it.
func mountPoints(root string, dirs ...string) error {
	for _, d := range dirs {
		fi, err := os.Lstat(root + d)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(root+d, 0o755); err != nil {
				return fmt.Errorf("make mount point %s: %w", d, err)
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("the image's %s is not a directory (%s): it cannot be a mount point", d, fi.Mode().Type())
		}
	}
	return nil
}

// mountTmp makes the new root's /tmp a tmpfs as gVisor sandboxes have it,
// so that /tmp is the same on both backends: memory, never in snapshots,
// half of the sandbox's memory limit (memory, in bytes, as the kernel's
// command line gives it) in size, or half of the VM's memory without one.
func mountTmp(memory string) error {
	if err := os.MkdirAll(newRoot+"/tmp", 0o1777); err != nil {
		return err
	}
	return mount("tmpfs", newRoot+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,"+tmpSize(memory))
}

// tmpSize is the size option of /tmp's tmpfs for a sandbox memory limit
// of memory bytes ("" or 0: none).
func tmpSize(memory string) string {
	if n, err := strconv.ParseInt(memory, 10, 64); err == nil && n > 0 {
		return fmt.Sprintf("size=%dk", max(1, n/2>>10))
	}
	return "size=50%"
}

// bindOverRoot puts a file of the initramfs holding content over path in
// the new root, so that what the host writes there (hosts, resolv.conf)
// never lands in the writable layer, and changes to it are in place. A
// path the image has as a directory or a device is left alone (logged).
func bindOverRoot(log *slog.Logger, path string, content []byte) error {
	own := "/" + filepath.Base(path)
	if err := os.WriteFile(own, content, 0o644); err != nil {
		return err
	}
	target, ok, err := rootFile(newRoot, path)
	if err != nil {
		return err
	}
	if !ok {
		log.Warn("not a regular file in the image; left as it is", "path", path)
		return nil
	}
	if err := unix.Mount(own, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", path, err)
	}
	return nil
}

// rootFile is the file a bind mount over path in root must cover: path
// itself or, when the image has a symlink there (/etc/resolv.conf ->
// ../run/systemd/resolve/stub-resolv.conf), where it leads, resolved
// inside root as a container runtime resolves a mount's destination. It is
// made, an empty file, when missing. ok is false when it is something
// other than a regular file.
func rootFile(root, path string) (target string, ok bool, err error) {
	target, err = securejoin.SecureJoin(root, path)
	if err != nil {
		return "", false, fmt.Errorf("resolve %s: %w", path, err)
	}
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return "", false, err
		}
		if err := os.WriteFile(target, nil, 0o644); err != nil {
			return "", false, err
		}
		return target, true, nil
	case err != nil:
		return "", false, err
	}
	return target, fi.Mode().IsRegular(), nil
}

// sortLowers orders the restored layers' directories for overlayfs: they
// are lower-0 (bottom) ... lower-N, and overlayfs wants the top first.
func sortLowers(dirs []string) {
	sort.Slice(dirs, func(i, j int) bool { return lowerIndex(dirs[i]) > lowerIndex(dirs[j]) })
}

func lowerIndex(p string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "lower-"))
	return n
}

func uptime() string {
	b, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0] + "s"
}

// loopbackUp brings lo up; the kernel then gives it 127.0.0.1 and ::1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// setupCgroup creates the sandbox cgroup with the limits from the command
// line. The guest's memory is the limit plus room for the kernel and the
// agent; here the sandbox's processes are held to the limit itself, so the
// guest kernel's OOM killer picks among them and never starves the agent.
func setupCgroup(params map[string]string) error {
	root := "/sys/fs/cgroup"
	if err := os.WriteFile(root+"/cgroup.subtree_control", []byte("+memory +pids +cpu"), 0); err != nil {
		return fmt.Errorf("enable cgroup controllers: %w", err)
	}
	if err := os.Mkdir(sandboxCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create sandbox cgroup: %w", err)
	}
	set := func(file, v string) error {
		if v == "" || v == "0" {
			return nil
		}
		if err := os.WriteFile(filepath.Join(sandboxCgroup, file), []byte(v), 0); err != nil {
			return fmt.Errorf("set %s=%s: %w", file, v, err)
		}
		return nil
	}
	if err := set("memory.max", params[paramMemory]); err != nil {
		return err
	}
	// No swap in the guest, but say so: a limit means a limit.
	_ = set("memory.swap.max", "0")
	return set("pids.max", params[paramPids])
}

// supervise starts vm-agent in its own PID and mount namespace and reaps
// everything; when the agent ends, the VM ends.
func supervise(log *slog.Logger, upper int, port string) error {
	cmd := exec.Command("/proc/self/exe", ModeAgent, "--port", port)
	cmd.Args[0] = "sandbox-agent"
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(upper), "upper")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start vm-agent: %w", err)
	}
	agentPID := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait: %w", err)
		}
		if pid == agentPID {
			log.Error("vm-agent exited; powering off", "status", ws.ExitStatus(), "signal", ws.Signal())
			powerOff()
		}
	}
}

// vmAgent is the agent proper, PID 1 of the sandbox's PID namespace.
func vmAgent(log *slog.Logger, version string, args []string) error {
	port := "sandboxd"
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--port" {
			port = args[i+1]
		}
	}
	// This mount namespace's /proc shows this PID namespace. Mounts here
	// must not propagate back to vm-init's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent.HandleSignals(cancel)
	const cwd = "/workspace"
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		log.Warn("create default working directory", "dir", cwd, "err", err)
	}
	a := agent.New(agent.Options{
		Version: version, Reap: true, Cwd: cwd, Logger: log,
		Cgroup: sandboxCgroup,
		// resolv.conf is vm-init's bind mount (see bindOverRoot).
		NetLink: "eth0", ResolvConf: "/etc/resolv.conf",
		// The upper dir is reached through the fd vm-init passed: it is
		// not visible in the sandbox's file tree.
		Layer: fmt.Sprintf("/proc/self/fd/%d/", upperFD),
	})
	if ln, err := net.Listen("tcp", "127.0.0.1:80"); err != nil {
		log.Warn("listen for sandboxd.internal", "err", err)
	} else {
		defer ln.Close()
		go func() {
			if err := a.ServeHome(ln); err != nil {
				log.Warn("home forwarding stopped", "err", err)
			}
		}()
	}
	path, err := waitPort(ctx, port)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		if waitHost(ctx, f) {
			if err := a.Serve(ctx, portConn{f}); err != nil && ctx.Err() == nil {
				log.Warn("session ended", "err", err)
			}
		}
		f.Close()
	}
	return nil
}

// waitPort waits for the virtio-serial port to appear (the driver may
// still be probing when the agent starts).
func waitPort(ctx context.Context, name string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := findPort(name)
		if err == nil {
			if _, serr := os.Stat(p); serr == nil {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitHost waits until the host end of the port is connected: the port
// reports POLLHUP while it is not. It returns false when ctx ends.
func waitHost(ctx context.Context, f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	for ctx.Err() == nil {
		var revents int16
		_ = rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
			if _, err := unix.Poll(pfd, 0); err == nil {
				revents = pfd[0].Revents
			}
		})
		if revents&unix.POLLHUP == 0 && revents != 0 {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// portConn is the virtio-serial port as the net.Conn the agent serves.
type portConn struct{ f *os.File }

func (c portConn) Read(p []byte) (int, error)         { return c.f.Read(p) }
func (c portConn) Write(p []byte) (int, error)        { return c.f.Write(p) }
func (c portConn) Close() error                       { return c.f.SetDeadline(time.Now()) }
func (c portConn) LocalAddr() net.Addr                { return portAddr{} }
func (c portConn) RemoteAddr() net.Addr               { return portAddr{} }
func (c portConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c portConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c portConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return "host" }
