package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/internal/extents"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A pause with the memory, in a cluster (Config.MovePauses), also saves
// the sandbox's state in the blob store when the runtime can move it
// (runtime.Mover: gVisor's checkpoint and writable layer, a microVM's
// memory state and layer disk), packed as
// their data extents (package extents), zstd-compressed, the key on its
// row (PausedState). Its node keeps its own copy and resumes from it as
// any pause; when the node goes down, the node that declares it so adopts
// the sandbox paused (FailHostedBy) instead of failing it, and a resume
// there — any use, as for any pause — restores it from the blob store
// (resumeMoved): the same id, processes and memory, its network on the
// new node's, a new key for what it starts from then on. A sandbox with
// volumes is not moved (its volumes' writes since their last sync are on
// its node), nor a gVisor one without a disk limit (its layer is a
// directory); their pauses stay their node's, as on one node.

// stateMagic starts a paused sandbox's state in the blob store.
const stateMagic = "sandboxd-paused-state-1\n"

// StateLimits bound a paused sandbox's state read back, maxBytes in all: a
// checkpoint's few files and a disk, two directories deep.
func StateLimits(maxBytes int64) extents.DirLimits {
	return extents.DirLimits{Files: 4096, Depth: 2, Bytes: maxBytes}
}

// PackState and UnpackState are a paused sandbox's state's format in the
// blob store (for the benchmark, which moves one as a cluster does).
func PackState(w io.Writer, dir string) error { return extents.PackDir(w, dir, stateMagic) }

// UnpackState reads PackState's stream r into dir within lim.
func UnpackState(r io.Reader, dir string, lim extents.DirLimits) error {
	return extents.UnpackDir(r, dir, stateMagic, lim)
}

// mover is the runtime's Mover when pauses are moved on this server.
func (m *Manager) mover() (runtime.Mover, bool) {
	if !m.cfg.MovePauses || m.cfg.Blobs == nil {
		return nil, false
	}
	mv, ok := m.rt.(runtime.Mover)
	return mv, ok
}

// savePausedState saves paused sandbox sb's state to the blob store and
// records it on its row; a failure leaves the pause its node's alone
// (logged: the sandbox is paused either way).
func (m *Manager) savePausedState(ctx context.Context, sb store.Sandbox) {
	mv, ok := m.mover()
	if !ok {
		return
	}
	if vols, err := m.st.SandboxVolumes(ctx, sb.ID); err != nil || len(vols) > 0 {
		return
	}
	start := m.now()
	key, size, err := m.packPausedState(ctx, mv, sb.ID)
	if err == nil {
		var ok bool
		if ok, err = m.st.SetPausedState(ctx, sb.ID, key); err == nil && !ok {
			err = errors.New("it left its pause meanwhile")
		}
		if err != nil {
			m.collectPausedState(ctx, key)
		}
	}
	if err != nil {
		m.log.Warn("pause: its state is kept on this node alone (another node cannot resume it)", "sandbox_id", sb.ID, "err", err)
		return
	}
	m.log.Info("pause: state saved to the blob store", "sandbox_id", sb.ID, "bytes", size, "elapsed", m.now().Sub(start))
}

// packPausedState writes the runtime's saved state of sandbox id into the
// blob store and answers its key and stored size.
func (m *Manager) packPausedState(ctx context.Context, mv runtime.Mover, id string) (string, int64, error) {
	dir, err := os.MkdirTemp(m.moveDir(), "save-")
	if err != nil {
		return "", 0, err
	}
	defer os.RemoveAll(dir)
	if err := mv.SaveMovable(ctx, id, dir); err != nil {
		return "", 0, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(extents.PackDir(pw, dir, stateMagic)) }()
	info, err := m.cfg.Blobs.Put(ctx, pr)
	pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return "", 0, fmt.Errorf("upload its state: %w", err)
	}
	return info.Key, info.Size, nil
}

// moveDir is where a node stages states it saves or restores (the data
// dir's disk, as the runtime's state).
func (m *Manager) moveDir() string {
	dir := filepath.Join(m.cfg.DataDir, "moves")
	_ = os.MkdirAll(dir, 0o700)
	return dir
}

// maxStateBytes bounds a state read from the blob store: the memory a
// save may write, the sandbox's disk, and room for the checkpoint's own.
func (m *Manager) maxStateBytes() int64 {
	l := m.cfg.Settings.Limits
	n := l.DiskBytes + 256<<20
	if s, ok := m.rt.(runtime.SaveSizer); ok {
		n += s.MaxSaveBytes(l)
	} else {
		n += l.MemoryBytes * 2
	}
	return n
}

// movedHere says paused sandbox sb's state is not on this node's runtime
// but in the blob store: a resume here restores it from there.
func (m *Manager) movedHere(ctx context.Context, sb store.Sandbox) bool {
	if sb.PausedState == "" {
		return false
	}
	if _, ok := m.mover(); !ok {
		return false
	}
	_, err := m.rt.Get(ctx, sb.ID)
	return errors.Is(err, runtime.ErrNotFound)
}

// resumeMoved restores sandbox sb, whose resume this node has claimed
// (paused → resuming), from its state in the blob store. A restore that
// fails leaves it paused, its state kept, for another try.
func (m *Manager) resumeMoved(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	out, err := m.resumeElsewhere(ctx, sb, "from its state in the blob store", "it stays paused", m.restoreMoved)
	if err == nil {
		m.collectPausedState(ctx, sb.PausedState)
	}
	return out, err
}

// restoreMoved fetches sb's state and places it on the runtime through
// the hooks (a key, a network, on this node); reason is the user's words
// for a failure.
func (m *Manager) restoreMoved(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, string, error) {
	release, err := m.admitDisk(ctx, 1)
	if err != nil {
		return nil, "its node has no disk for it", err
	}
	release()
	dir, err := os.MkdirTemp(m.moveDir(), "restore-")
	if err != nil {
		return nil, reasonStartGeneric, err
	}
	defer os.RemoveAll(dir)
	fetch := time.Now()
	rc, err := m.cfg.Blobs.Get(ctx, sb.PausedState)
	if err != nil {
		return nil, "its saved state could not be read", err
	}
	err = extents.UnpackDir(rc, dir, stateMagic, StateLimits(m.maxStateBytes()))
	rc.Close()
	if err != nil {
		return nil, "its saved state could not be read", err
	}
	m.log.Debug("resume: state fetched from the blob store", "sandbox_id", sb.ID, "elapsed", time.Since(fetch))
	rsb, _, _, reason, err := m.placeFrom(ctx, &sb, "could not open its template", dir)
	return rsb, reason, err
}

// collectPausedState deletes a pause's state from the blob store (it
// was resumed or stopped): a state is one pause's alone.
func (m *Manager) collectPausedState(ctx context.Context, key string) {
	if key == "" || m.cfg.Blobs == nil {
		return
	}
	if err := m.cfg.Blobs.Delete(context.WithoutCancel(ctx), key); err != nil {
		m.log.Warn("delete a paused sandbox's state", "blob", key, "err", err)
	}
}
