package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
//
// Debian's 2022 runsc cannot leave a paused container running after
// checkpoint --leave-running (it saves it, then panics with the container
// gone); its save trial says so (saveprobe.go), and there a fork saves the
// parent as a pause does, copies its layer while nothing runs, and
// restores it before making the children: the parent runs on, its
// processes restored from the same memory as its children's. Whatever
// runsc, a save that fails never ends the parent by our doing: it is
// resumed, or restored from what the save wrote (recoverParent).

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
	// The children are made from what is saved in the parent's directory.
	dir := p.Path(forkDir)
	return host.ForkSaved(ctx, r.Base, &p.Attachment, children, func(pm meta) host.Forking[*sandbox] {
		return host.Forking[*sandbox]{
			Save: func(ctx context.Context) error { return p.saveForFork(ctx, dir) },
			Start: func(ctx context.Context, spec runtime.Spec) (*sandbox, error) {
				return r.forkChild(ctx, pm, spec, dir)
			},
			Done: func() { _ = os.RemoveAll(dir) },
		}
	})
}

// saveForFork saves the running container's memory into dir/checkpoint and
// a copy of its writable layer into dir, and lets it run on; callers hold
// OpMu. How depends on what its runsc can do (saveSupportOf): a runsc
// whose checkpoint cannot leave a container running saves it as a pause
// does and restores it; one that cannot save at all is refused with
// nothing touched.
func (s *sandbox) saveForFork(ctx context.Context, dir string) error {
	m := s.Meta()
	sup, err := s.r.savable(ctx, m)
	if err != nil {
		return err
	}
	_ = os.RemoveAll(dir) // an earlier fork's that did not finish
	if !sup.LeaveRunning {
		return s.saveForForkByPause(ctx, dir)
	}
	return s.saveForForkRunning(ctx, dir)
}

// saveForForkRunning saves the container with `runsc checkpoint
// --leave-running` while runsc holds it paused, copies its layer, and
// resumes it. A save that failed never ends the parent by our doing: it is
// resumed, or, when the save ended its container, restored from what the
// save wrote (see recoverParent).
func (s *sandbox) saveForForkRunning(ctx context.Context, dir string) (err error) {
	if err := s.readyToSave(ctx); err != nil {
		return err
	}
	m := s.Meta()
	image := filepath.Join(dir, checkpointDir)
	if err := os.MkdirAll(image, 0o700); err != nil {
		return s.reattachAfter(err)
	}
	if _, err := s.r.runscRun(ctx, m, "pause", m.CID); err != nil {
		return s.reattachAfter(err)
	}
	if _, err := s.r.runscRun(ctx, m, "checkpoint", "--leave-running", "--image-path", image, m.CID); err != nil {
		return s.recoverParent(ctx, image, err)
	}
	defer func() {
		// Whatever happened, the parent runs on, served again.
		rctx := context.WithoutCancel(ctx)
		if _, rerr := s.r.runscRun(rctx, m, "resume", m.CID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		err = s.reattachAfter(err)
	}()
	return s.copyLayer(ctx, dir)
}

// recoverParent brings back a parent whose fork save failed with err, and
// returns err with what recovering it met: resumed when its container is
// still there; when the save ended it (as Debian's 2022 runsc does after
// saving a paused container), restored from the image the save wrote,
// as a resume does, or left paused with that image when the restore
// fails (a later resume may try again; stop ends it).
func (s *sandbox) recoverParent(ctx context.Context, image string, err error) error {
	ctx = context.WithoutCancel(ctx)
	m := s.Meta()
	if _, rerr := s.r.runscRun(ctx, m, "resume", m.CID); rerr == nil {
		return s.reattachAfter(err)
	}
	if st, serr := s.State(ctx); serr == nil && st == runtime.StateRunning {
		return s.reattachAfter(err)
	}
	if !hasFiles(image) {
		return fmt.Errorf("%w; the sandbox ended with the save, which left nothing to restore it from", err)
	}
	saved := s.Path(checkpointDir)
	_ = os.RemoveAll(saved)
	if rerr := os.Rename(image, saved); rerr != nil {
		return errors.Join(err, rerr)
	}
	if rerr := s.SetMeta(func(m *meta) { m.Paused = true }); rerr != nil {
		return errors.Join(err, rerr)
	}
	if rerr := endCgroup(m.CgroupPath, 10*time.Second); rerr != nil {
		s.r.log.Warn("fork: the ended parent's cgroup", "id", m.ID, "err", rerr)
	}
	if rerr := s.resume(ctx); rerr != nil {
		return errors.Join(err, fmt.Errorf("the save ended the sandbox, and restoring it from what the save wrote failed (it stays paused): %w", rerr))
	}
	s.r.log.Warn("fork: the save ended the parent; restored it from what the save wrote", "id", m.ID, "err", err)
	return err
}

// saveForForkByPause saves the container for a fork on a runsc whose
// checkpoint cannot leave it running: it is paused (saved whole, its
// processes ended), the saved state is linked into dir and its writable
// layer copied while nothing runs, and it is resumed. A resume that fails
// leaves it paused with its memory, as a failed Resume does.
func (s *sandbox) saveForForkByPause(ctx context.Context, dir string) error {
	if err := s.pause(ctx); err != nil {
		return err
	}
	err := linkFiles(s.Path(checkpointDir), filepath.Join(dir, checkpointDir))
	if err == nil {
		err = s.copyLayer(ctx, dir)
	}
	if rerr := s.resume(context.WithoutCancel(ctx)); rerr != nil {
		return errors.Join(err, fmt.Errorf("resume the parent after its save: %w", rerr))
	}
	return err
}

// linkFiles makes dst a tree of hard links to the files of src (a saved
// state, which stays read-only: the parent's resume removes src, the
// children restore from dst).
func linkFiles(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		return os.Link(path, to)
	})
}

// hasFiles says dir holds at least one file.
func hasFiles(dir string) bool {
	ents, err := os.ReadDir(dir)
	return err == nil && len(ents) > 0
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
		Disk: parent.Disk, AgentSecret: parent.AgentSecret, AgentTTYSignals: parent.AgentTTYSignals}
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
