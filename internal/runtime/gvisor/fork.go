package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// Fork with gVisor's checkpoint/restore. The parent's agent syncs and its
// session ends (as for a pause: a sandbox holding a host socket cannot be
// saved), runsc pauses it, and `runsc checkpoint --leave-running` saves its
// memory while it stays paused (the sentry counts external stops: the
// checkpoint's own pause and resume nest inside runsc's). Still paused, its
// writable layer is copied: the disk image with its file system frozen, so
// that the copy is clean and holds what the memory refers to. Then the
// parent resumes and its agent dials in again, and each child is restored
// from the saved memory over a copy of the layer, under its own container
// id, bundle, cgroup, agent socket and network namespace (runsc restore
// validates the child's bundle against the parent's: mount sources, the
// cgroup path, the hostname and the environment may differ). A restored
// netstack takes the addresses and routes of the namespace it is restored
// in, so a child with a network has its own. The children's agents hold the
// parent's session secret in memory, so each child's meta keeps it: it
// opens only that child's own socket.

// forkDir is where a fork keeps the parent's saved state and the copy of
// its writable layer while it restores the children, in the parent's state
// directory.
const forkDir = "fork"

var _ runtime.Forker = (*Runtime)(nil)

// Fork implements runtime.Forker.
func (r *Runtime) Fork(ctx context.Context, parentID string, children []runtime.Spec) ([]runtime.Sandbox, error) {
	p, err := r.Table().Get(parentID)
	if err != nil {
		return nil, err
	}
	// The parent's lifecycle waits (pause, destroy) until its children
	// are made from what is saved in its directory.
	p.opMu.Lock()
	defer p.opMu.Unlock()
	pm := p.Meta()
	if err := runtime.ForkSpecs(pm.Network != nil, children); err != nil {
		return nil, err
	}
	start := time.Now()
	dir := p.Path(forkDir)
	defer os.RemoveAll(dir)
	if err := p.saveForFork(ctx, dir); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", parentID, err)
	}
	saved := time.Since(start)
	kids, err := r.Base.Fork(ctx, pm.Record, children, func(ctx context.Context, spec runtime.Spec) (*sandbox, error) {
		return r.forkChild(ctx, pm, spec, dir)
	})
	if err != nil {
		return nil, err
	}
	r.log.Info("sandbox forked", "id", parentID, "children", len(kids),
		"save", saved.Round(time.Millisecond), "elapsed", time.Since(start).Round(time.Millisecond))
	return kids, nil
}

// saveForFork saves the running container's memory into dir/checkpoint and
// a copy of its writable layer into dir, and lets it run on; callers hold
// opMu.
func (s *sandbox) saveForFork(ctx context.Context, dir string) (err error) {
	if err := s.readyToSave(ctx); err != nil {
		return err
	}
	m := s.Meta()
	_ = os.RemoveAll(dir) // an earlier fork's that did not finish
	if err := os.MkdirAll(filepath.Join(dir, checkpointDir), 0o700); err != nil {
		return s.reattachAfter(err)
	}
	if _, err := s.r.runscRun(ctx, m, "pause", m.CID); err != nil {
		return s.reattachAfter(err)
	}
	defer func() {
		// Whatever happened, the parent runs on (unless the save ended
		// it), served again.
		rctx := context.WithoutCancel(ctx)
		if _, rerr := s.r.runscRun(rctx, m, "resume", m.CID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		err = s.reattachAfter(err)
	}()
	if _, err := s.r.runscRun(ctx, m, "checkpoint", "--leave-running", "--image-path", filepath.Join(dir, checkpointDir), m.CID); err != nil {
		return err
	}
	return s.copyLayer(ctx, dir)
}

// copyLayer copies the paused container's writable layer into dir: its
// disk image, with the file system frozen (flushed whole, writes held)
// while it is read, or the plain layer directory.
func (s *sandbox) copyLayer(ctx context.Context, dir string) error {
	if !s.Meta().Disk {
		return copyTree(ctx, s.Path("layer"), filepath.Join(dir, "layer"))
	}
	if err := fsfreeze(ctx, "--freeze", s.Path("layer")); err != nil {
		return err
	}
	err := host.CopySparse(s.Path("disk.img"), filepath.Join(dir, "disk.img"), 0o600)
	if terr := fsfreeze(context.WithoutCancel(ctx), "--unfreeze", s.Path("layer")); terr != nil {
		err = errors.Join(err, terr)
	}
	return err
}

// forkChild makes the child spec (a host.ChildSpec) of the parent whose
// meta is parent, from what saveForFork left in dir.
func (r *Runtime) forkChild(ctx context.Context, parent meta, spec runtime.Spec, dir string) (*sandbox, error) {
	cid := host.NewCID("sbx-")
	link := r.Table().Dir.Path(spec.ID)
	if err := r.Table().Dir.Claim(spec.ID, cid); err != nil {
		return nil, err
	}
	m := meta{Record: host.NewRecord(spec, cid), Platform: parent.Platform, Runsc: parent.Runsc,
		Disk: parent.Disk, AgentSecret: parent.AgentSecret}
	m.Layers = parent.Layers
	s := newSandbox(r, r.Table().Dir.SandboxDir(cid), m)
	return r.Made(ctx, spec.ID, link, s, s.restoreFork(ctx, dir))
}

// restoreFork makes the sandbox's writable layer a copy of the one in dir
// and restores the container from the memory saved there.
func (s *sandbox) restoreFork(ctx context.Context, dir string) error {
	if err := s.makeDirs(); err != nil {
		return err
	}
	if s.Meta().Disk {
		if err := host.CopySparse(filepath.Join(dir, "disk.img"), s.Path("disk.img"), 0o600); err != nil {
			return err
		}
		if err := mountDisk(ctx, s.Path("disk.img"), s.Path("layer")); err != nil {
			return err
		}
	} else if err := copyTree(ctx, filepath.Join(dir, "layer"), s.Path("layer")); err != nil {
		return err
	}
	return s.start(ctx, "restore", "--image-path", filepath.Join(dir, checkpointDir), "--bundle", s.Path("bundle"), "--detach", s.Meta().CID)
}

// copyTree copies the directory src to dst (made if missing) with
// everything in it as it is: owners, modes, times, links, holes.
func copyTree(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", src+"/.", dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fsfreeze freezes or thaws the file system mounted at dir (util-linux).
func fsfreeze(ctx context.Context, op, dir string) error {
	out, err := exec.CommandContext(ctx, "fsfreeze", op, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fsfreeze %s %s: %w: %s", op, dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}
