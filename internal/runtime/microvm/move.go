package microvm

import (
	"context"
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// A paused VM moved to another host, as a fork's child is made: SaveMovable
// writes the pause's memory state, a copy of the layer disk (nothing writes
// to it while the VM is parked) and what the restore needs (its manifest:
// the VM's configuration, the parked agent's hello, the restored layers)
// into a directory; RestoreMoved makes the sandbox from it the way a
// sandbox is made from a template: QEMU started from the saved memory over
// a copy of the disk, the agent's hello answered, its clock set and fresh
// entropy given, and its link configured for the new host's network.

var _ runtime.Mover = (*Runtime)(nil)

// SaveMovable implements runtime.Mover.
func (r *Runtime) SaveMovable(ctx context.Context, id, dir string) error {
	s, err := r.get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	m := s.Meta()
	switch {
	case !m.Paused:
		return fmt.Errorf("save sandbox %s: %w: it is not paused", id, runtime.ErrNotMovable)
	case len(m.Volumes) > 0:
		return fmt.Errorf("save sandbox %s: %w: it has volumes", id, runtime.ErrNotMovable)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tp := template{Key: "moved-" + m.CID, Limits: m.Limits, Hostname: m.Hostname, VM: m.VM, Hello: m.Hello, Layers: m.Layers, Linked: m.Network != nil, dir: dir}
	if err := host.CopySparse(s.Path("memory.state"), tp.state(), 0o600); err != nil {
		return fmt.Errorf("save sandbox %s: its memory: %w", id, err)
	}
	if err := host.CopySparse(s.jail("disk", "layer.ext4"), tp.layer(), 0o600); err != nil {
		return fmt.Errorf("save sandbox %s: its disk: %w", id, err)
	}
	return host.WriteMovedManifest(dir, tp)
}

// RestoreMoved implements runtime.Mover.
func (r *Runtime) RestoreMoved(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if err := r.Check(&spec); err != nil {
		return nil, err
	}
	if err := checkNetwork(spec.Network); err != nil {
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	if len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("restore sandbox %s: %w: volumes are not moved", spec.ID, runtime.ErrNotMovable)
	}
	tp, err := host.ReadMovedManifest[template](dir)
	if err != nil {
		return nil, fmt.Errorf("restore sandbox %s: its manifest: %w", spec.ID, err)
	}
	if tp.VM.Accel != r.accel {
		return nil, fmt.Errorf("restore sandbox %s: %w: it was saved under %s, and this host runs %s", spec.ID, runtime.ErrNotMovable, tp.VM.Accel, r.accel)
	}
	// The VM is the saved one: its limits and hostname were fixed when it
	// booted, and its base is this host's copy of the same image.
	tp.dir, tp.BaseDir = dir, spec.BaseDir
	spec.Limits, spec.Hostname = tp.Limits, tp.Hostname
	s, err := r.createFromTemplate(ctx, spec, r.Table().Dir.Path(spec.ID), &tp)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}
