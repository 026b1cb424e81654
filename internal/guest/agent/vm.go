package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// vmState is what the VM operations share: the sandbox cgroup, opened once,
// and whether the agent froze it.
type vmState struct {
	once      sync.Once
	cgroupDir *os.File
	cgroupErr error

	mu     sync.Mutex
	frozen bool
}

// cgroup opens Options.Cgroup once; nil when there is none.
func (a *Agent) cgroup() (*os.File, error) {
	if a.opts.Cgroup == "" {
		return nil, nil
	}
	a.vm.once.Do(func() {
		a.vm.cgroupDir, a.vm.cgroupErr = os.OpenFile(a.opts.Cgroup, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	return a.vm.cgroupDir, a.vm.cgroupErr
}

// oomKills is the sandbox cgroup's count of processes the kernel's OOM
// killer took (memory.events oom_kill); false without a cgroup v2 one.
func (a *Agent) oomKills() (uint64, bool) {
	if a.opts.Cgroup == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(a.opts.Cgroup, "memory.events"))
	if err != nil {
		return 0, false
	}
	return parseOOMKills(b)
}

// parseOOMKills reads the oom_kill line of a memory.events file.
func parseOOMKills(b []byte) (uint64, bool) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// killedLike says whether a session ended as an OOM kill leaves it: its
// leader killed by SIGKILL, or exiting 137 (a shell whose child was).
func killedLike(ws syscall.WaitStatus) bool {
	return (ws.Signaled() && ws.Signal() == syscall.SIGKILL) || (ws.Exited() && ws.ExitStatus() == 128+int(syscall.SIGKILL))
}

// placeInCgroup makes cmd start inside Options.Cgroup (clone3 with
// CLONE_INTO_CGROUP), so no process of the sandbox ever runs outside its
// limits, not even between fork and exec.
func (a *Agent) placeInCgroup(cmd *exec.Cmd) {
	dir, err := a.cgroup()
	if dir == nil {
		if err != nil {
			a.log.Warn("sandbox cgroup unavailable; process runs without limits", "cgroup", a.opts.Cgroup, "err", err)
		}
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(dir.Fd())
}

// agentService is sandboxd's own agent API (agent.v1), served to the host.
type agentService struct{ a *Agent }

func (s agentService) Health(context.Context, *connect.Request[agentv1.HealthRequest]) (*connect.Response[agentv1.HealthResponse], error) {
	return connect.NewResponse(s.a.health()), nil
}

func (s agentService) Sync(context.Context, *connect.Request[agentv1.SyncRequest]) (*connect.Response[agentv1.SyncResponse], error) {
	unix.Sync()
	checkpointDisks("/proc/self/mounts")
	return connect.NewResponse(&agentv1.SyncResponse{}), nil
}

// The file system freeze ioctls: _IOWR('X', 119, int) and 120.
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// checkpointDisks freezes and thaws each ext4 file system on a disk of
// its own mounted read-write (a microVM's volumes), as listed in mounts:
// freezing writes its journal's transactions in place, so that the disk,
// once the VM is gone, reads whole without replaying the journal (a
// read-only attach cannot replay it). Under gVisor nothing is listed: its
// mounts are the host's.
func checkpointDisks(mounts string) {
	b, err := os.ReadFile(mounts)
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[2] != "ext4" || !strings.HasPrefix(f[0], "/dev/vd") || !slices.Contains(strings.Split(f[3], ","), "rw") {
			continue
		}
		dir, err := os.Open(strings.ReplaceAll(f[1], "\\040", " "))
		if err != nil {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, dir.Fd(), fiFreeze, 0); errno == 0 {
			_, _, _ = unix.Syscall(unix.SYS_IOCTL, dir.Fd(), fiThaw, 0)
		}
		dir.Close()
	}
}

func (s agentService) OOMKill(context.Context, *connect.Request[agentv1.OOMKillRequest]) (*connect.Response[agentv1.OOMKillResponse], error) {
	k := s.a.procs.oomKill()
	return connect.NewResponse(&agentv1.OOMKillResponse{Pid: uint32(k.PID), Name: k.Name, Rss: k.RSS}), nil
}

func (s agentService) Freeze(context.Context, *connect.Request[agentv1.FreezeRequest]) (*connect.Response[agentv1.FreezeResponse], error) {
	unix.Sync()
	if err := s.a.setFrozen(true); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&agentv1.FreezeResponse{}), nil
}

func (s agentService) Thaw(context.Context, *connect.Request[agentv1.ThawRequest]) (*connect.Response[agentv1.ThawResponse], error) {
	if err := s.a.setFrozen(false); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&agentv1.ThawResponse{}), nil
}

func (s agentService) SetClock(_ context.Context, req *connect.Request[agentv1.SetClockRequest]) (*connect.Response[agentv1.SetClockResponse], error) {
	if err := setClock(req.Msg.GetUnixNano(), req.Msg.GetEntropy()); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&agentv1.SetClockResponse{}), nil
}

func (s agentService) ExportLayer(ctx context.Context, req *connect.Request[agentv1.ExportLayerRequest], stream *connect.ServerStream[agentv1.ExportLayerResponse]) error {
	if err := s.a.exportLayer(ctx, stream, req.Msg); err != nil {
		s.a.log.Warn("export layer", "err", err)
		return connect.NewError(connect.CodeInternal, err)
	}
	return nil
}

// setFrozen freezes or thaws the sandbox cgroup and waits until the kernel
// reports it done (freezing waits for every task to reach the freezer).
func (a *Agent) setFrozen(freeze bool) error {
	if a.opts.Cgroup == "" {
		return errors.New("this agent has no sandbox cgroup to freeze")
	}
	a.vm.mu.Lock()
	defer a.vm.mu.Unlock()
	want := "0"
	if freeze {
		want = "1"
	}
	if err := os.WriteFile(filepath.Join(a.opts.Cgroup, "cgroup.freeze"), []byte(want), 0); err != nil {
		return fmt.Errorf("freeze %s: %w", a.opts.Cgroup, err)
	}
	a.vm.frozen = freeze
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(a.opts.Cgroup, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("read cgroup.events: %w", err)
		}
		if bytes.Contains(b, []byte("frozen "+want)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s not frozen=%s after 10s", a.opts.Cgroup, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// exportLayer writes the writable layer to the stream in chunks.
func (a *Agent) exportLayer(ctx context.Context, stream *connect.ServerStream[agentv1.ExportLayerResponse], lr *agentv1.ExportLayerRequest) error {
	if a.opts.Layer == "" {
		return errors.New("this agent has no writable layer to export")
	}
	a.vm.mu.Lock()
	frozen := a.vm.frozen
	a.vm.mu.Unlock()
	if !frozen && a.opts.Cgroup != "" {
		unix.Sync()
		if err := a.setFrozen(true); err != nil {
			return err
		}
		defer func() {
			if err := a.setFrozen(false); err != nil {
				a.log.Error("thaw after export", "err", err)
			}
		}()
	}
	unix.Sync()
	// The layer disk bounds what there is to write; the host bounds what it
	// reads of the stream, since it cannot trust this side.
	_, err := snapshot.Write(ctx, layerChunks{stream}, a.opts.Layer, snapshot.Manifest{Parent: lr.GetParent(), BaseImage: lr.GetBaseImage()}, nil)
	return err
}

// layerChunks writes its input as messages of at most chunkSize bytes.
type layerChunks struct {
	stream *connect.ServerStream[agentv1.ExportLayerResponse]
}

func (l layerChunks) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), chunkSize)
		if err := l.stream.Send(&agentv1.ExportLayerResponse{Data: p[:c]}); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// setClock sets the wall clock and feeds the host's entropy to the kernel,
// crediting it and forcing the CRNG to reseed at once.
func setClock(unixNano int64, entropy []byte) error {
	ts := unix.NsecToTimespec(unixNano)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	if len(entropy) == 0 {
		return nil
	}
	if len(entropy) > 512 {
		entropy = entropy[:512]
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(entropy))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(entropy)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("reseed: add entropy: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("reseed: %w", errno)
	}
	return nil
}
