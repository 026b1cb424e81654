package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// A paused sandbox moved to another host, as a fork moves a copy to
// another sandbox of this one: SaveMovable writes the pause's checkpoint,
// a copy of the writable layer's disk (frozen while it is read) and the
// meta the restore needs (moved.json) into a directory; RestoreMoved
// makes the sandbox from such a directory on this host, under a container
// id, bundle, cgroup, agent socket and network namespace of its own, with
// the saved agent's session secret (its memory holds it).

var _ runtime.Mover = (*Runtime)(nil)

// movedManifest is the meta a moved sandbox takes from the one saved (its
// directory's host.WriteMovedManifest).
type movedManifest struct {
	AgentSecret     string   `json:"agent_secret"`
	Layers          []string `json:"layers,omitempty"`
	AgentTTYSignals bool     `json:"agent_tty_signals,omitempty"`
}

// SaveMovable implements runtime.Mover.
func (r *Runtime) SaveMovable(ctx context.Context, id, dir string) error {
	s, err := r.Table().Get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	m := s.Meta()
	switch {
	case !m.Paused:
		return fmt.Errorf("save sandbox %s: %w: it is not paused", id, runtime.ErrNotMovable)
	case !m.Disk:
		return fmt.Errorf("save sandbox %s: %w: its writable layer is a directory, not a disk (no disk limit)", id, runtime.ErrNotMovable)
	case len(m.Volumes) > 0:
		return fmt.Errorf("save sandbox %s: %w: it has volumes mounted", id, runtime.ErrNotMovable)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := copyFiles(s.Path(checkpointDir), filepath.Join(dir, checkpointDir)); err != nil {
		return fmt.Errorf("save sandbox %s: its checkpoint: %w", id, err)
	}
	if err := s.copyLayer(ctx, dir); err != nil {
		return fmt.Errorf("save sandbox %s: its writable layer: %w", id, err)
	}
	return host.WriteMovedManifest(dir, movedManifest{AgentSecret: m.AgentSecret, Layers: m.Layers, AgentTTYSignals: m.AgentTTYSignals})
}

// copyFiles makes dst a tree of links to the files of src, or of copies
// where src is on another file system.
func copyFiles(src, dst string) error {
	if err := linkFiles(src, dst); err == nil {
		return nil
	}
	_ = os.RemoveAll(dst)
	return copyTree(context.Background(), src, dst)
}

// RestoreMoved implements runtime.Mover.
func (r *Runtime) RestoreMoved(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if err := r.Check(&spec); err != nil {
		return nil, err
	}
	if len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("restore sandbox %s: %w: volumes are not moved", spec.ID, runtime.ErrNotMovable)
	}
	man, err := host.ReadMovedManifest[movedManifest](dir)
	if err != nil || man.AgentSecret == "" {
		return nil, fmt.Errorf("restore sandbox %s: its manifest: %v", spec.ID, err)
	}
	cid := host.NewCID("sbx-")
	link := r.Table().Dir.Path(spec.ID)
	if err := r.Table().Dir.Claim(spec.ID, cid); err != nil {
		return nil, err
	}
	m := meta{Record: host.NewRecord(spec, cid), Platform: r.platform, Runsc: r.runsc.Path,
		Disk: true, AgentSecret: man.AgentSecret, AgentTTYSignals: man.AgentTTYSignals}
	m.Layers = man.Layers
	s := newSandbox(r, r.Table().Dir.SandboxDir(cid), m)
	made, err := r.Made(ctx, spec.ID, link, s, s.restoreFork(ctx, dir))
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return made, nil
}
