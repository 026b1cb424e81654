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
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
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

// serveVM answers the VM operations (see internal/guest/vm.go).
func (a *Agent) serveVM(w *frameWriter, req guest.Request) {
	fail := func(err error) {
		_ = w.json(guest.FrameResult, guest.Result{Error: err.Error(), ErrorKind: guest.KindOther})
	}
	switch req.Op {
	case guest.OpFreeze:
		unix.Sync()
		if err := a.setFrozen(true); err != nil {
			fail(err)
			return
		}
		_ = w.json(guest.FrameResult, guest.Result{})
	case guest.OpThaw:
		if err := a.setFrozen(false); err != nil {
			fail(err)
			return
		}
		_ = w.json(guest.FrameResult, guest.Result{})
	case guest.OpSetClock:
		if req.Clock == nil {
			fail(errors.New("set-clock without a clock"))
			return
		}
		if err := setClock(*req.Clock); err != nil {
			fail(err)
			return
		}
		_ = w.json(guest.FrameResult, guest.Result{})
	case guest.OpExportLayer:
		err := a.exportLayer(w, req.Layer)
		end := guest.End{}
		if err != nil {
			a.log.Warn("export layer", "err", err)
			end.Error = err.Error()
		}
		_ = w.final(guest.FrameEnd, end)
	}
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

// exportLayer writes the writable layer to the stream as Data frames.
func (a *Agent) exportLayer(w *frameWriter, lr *guest.LayerRequest) error {
	if a.opts.Layer == "" {
		return errors.New("this agent has no writable layer to export")
	}
	if lr == nil {
		lr = &guest.LayerRequest{}
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
	_, err := snapshot.Write(context.Background(), dataFrames{w}, a.opts.Layer, snapshot.Manifest{Parent: lr.Parent, BaseImage: lr.BaseImage}, nil)
	return err
}

// dataFrames writes its input as FrameData frames of at most 32 KiB.
type dataFrames struct{ w *frameWriter }

func (d dataFrames) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), 32<<10)
		if err := d.w.frame(guest.FrameData, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// setClock sets the wall clock and feeds the host's entropy to the kernel,
// crediting it and forcing the CRNG to reseed at once.
func setClock(c guest.ClockRequest) error {
	ts := unix.NsecToTimespec(c.UnixNano)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	if len(c.Entropy) == 0 {
		return nil
	}
	if len(c.Entropy) > 512 {
		c.Entropy = c.Entropy[:512]
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(c.Entropy))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(c.Entropy)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(c.Entropy)))
	copy(info[8:], c.Entropy)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("reseed: add entropy: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("reseed: %w", errno)
	}
	return nil
}
