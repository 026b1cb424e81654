package sandbox

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Sandbox disks are sparse images of Limits.DiskBytes: creating one costs
// almost nothing, filling it costs the whole size. Without a check a node
// would hand out more disk than it has, and the tenant who fills the last
// block takes the host's disk (the database, the repositories, every other
// sandbox) down with it. admitDisk refuses a create whose disk the node
// could not honour if every active sandbox filled its own:
//
//	free - reserve - Σ(limit - allocated of each active sandbox) - saving >= limit
//
// Allocated bytes are already out of free, so a sandbox's writes do not
// change the balance; only creates and destroys do. The check is node-local
// (it is this node's disk), so a mutex held from the check to the row's
// insert makes simultaneous creates see each other: a pending row counts
// with its whole limit.
//
// Saving a sandbox's memory (a pause's checkpoint; a fork's saved state and
// the copy of its layer the children are made from) writes as much to the
// same disk, and a paused sandbox's checkpoint stays there until it resumes
// or stops. admitSave reserves what a save may write before it begins
// (saving, above: a bound, not a guess — runtime.SaveSizer) and refuses a
// save the disk cannot hold beside what it promised, with the sandbox left
// running as it was. Once the save ends the reservation goes: what it
// wrote is out of free from then on, like a sandbox's own writes, and what
// it removed is back. (While it writes, both count: the node refuses a
// little early for the seconds a save takes, never late.)

// diskFree is the space available to unprivileged writers on dir's
// filesystem (statfs f_bavail): what is left before root's reserve.
func diskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// diskBalance is this node's disk as admission sees it.
type diskBalance struct {
	free, reserve int64
	// promised is what the active and warm sandboxes may still write to
	// their disks; saving what saves under way may still write.
	promised, saving int64
	active, warm     int
}

// room is what is left to promise.
func (b diskBalance) room() int64 { return b.free - b.reserve - b.promised - b.saving }

// String gives the figures a refusal names.
func (b diskBalance) String() string {
	return fmt.Sprintf("%d MiB free, %d MiB promised to its %d active and %d warm sandboxes, %d MiB to memory being saved, %d MiB kept for the service",
		b.free>>20, b.promised>>20, b.active, b.warm, b.saving>>20, b.reserve>>20)
}

// balance measures the node's disk; callers hold m.diskMu.
func (m *Manager) balance(ctx context.Context) (diskBalance, error) {
	free, err := m.diskFreeFn(m.cfg.DataDir)
	if err != nil {
		return diskBalance{}, fmt.Errorf("check free disk: %w", err)
	}
	b := diskBalance{free: free, reserve: m.cfg.Settings.DiskReserveBytes, saving: m.saving}
	limit := m.cfg.Settings.Limits.DiskBytes
	if limit <= 0 {
		// No per-sandbox limit: nothing to promise, but the node's own
		// reserve and the saves under way still hold.
		return b, nil
	}
	active, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxPending, store.SandboxRunning, store.SandboxStopping)
	if err != nil {
		return diskBalance{}, fmt.Errorf("list this node's sandboxes: %w", err)
	}
	b.active, b.warm = len(active), m.warmSandboxes()
	b.promised = int64(b.warm) * limit
	for _, sb := range active {
		owed := limit
		if rsb, err := m.rt.Get(ctx, sb.ID); err == nil {
			owed -= rsb.HostDiskBytes()
		}
		b.promised += max(0, owed)
	}
	return b, nil
}

// admitDisk checks the node's disk for n more sandboxes; on success the
// caller holds m.diskMu until their rows are recorded, and must call the
// returned release.
func (m *Manager) admitDisk(ctx context.Context, n int) (release func(), err error) {
	defer func() { m.ops.diskRefused("sandbox", err) }()
	limit := m.cfg.Settings.Limits.DiskBytes
	m.diskMu.Lock()
	release = m.diskMu.Unlock
	if m.cfg.DataDir == "" {
		return release, nil
	}
	b, err := m.balance(ctx)
	if err != nil {
		release()
		return nil, err
	}
	if limit <= 0 {
		if b.room() < 0 {
			release()
			return nil, errdefs.Newf(errdefs.ErrQuota, "the server is out of disk space (%s); try again later", b)
		}
		return release, nil
	}
	if short := int64(n)*limit - b.room(); short > 0 && m.yieldWarm(int((short+limit-1)/limit)) > 0 {
		// Warm sandboxes beyond the pool's floor made way.
		if b, err = m.balance(ctx); err != nil {
			release()
			return nil, err
		}
	}
	if b.room() < int64(n)*limit {
		release()
		what := "another sandbox"
		if n > 1 {
			what = fmt.Sprintf("%d more sandboxes", n)
		}
		return nil, errdefs.Newf(errdefs.ErrQuota, "the server's disk cannot hold %s of %d MiB: %s; try again later", what, limit>>20, b)
	}
	return release, nil
}

// admitSave reserves bytes of the node's disk for saving the memory of
// sandbox id (what: "pause" or "fork"), or refuses (ErrQuota, 429) when
// the disk cannot hold them beside what it promised. The caller calls done
// once the save has ended, whichever way; the reservation counts against
// every admission until then.
func (m *Manager) admitSave(ctx context.Context, id, what string, bytes int64) (done func(), err error) {
	defer func() { m.ops.diskRefused(what, err) }()
	m.diskMu.Lock()
	defer m.diskMu.Unlock()
	if m.cfg.DataDir != "" {
		b, err := m.balance(ctx)
		if err != nil {
			return nil, err
		}
		if b.room() < bytes {
			return nil, errdefs.Newf(errdefs.ErrQuota, "the server's disk cannot hold the %d MiB a %s of sandbox %s saves (its memory): %s; try again later",
				bytes>>20, what, id, b)
		}
	}
	m.saving += bytes
	var once sync.Once
	return func() {
		once.Do(func() {
			m.diskMu.Lock()
			m.saving -= bytes
			m.diskMu.Unlock()
		})
	}, nil
}

// saveBytes bounds what saving the memory of running sandbox id writes to
// the node's disk: the runtime's bound for the node's limits
// (runtime.SaveSizer), else the memory limit itself; with no memory limit
// there is no bound, and what the sandbox holds now is the best guess.
func (m *Manager) saveBytes(ctx context.Context, id string) int64 {
	l := m.cfg.Settings.Limits
	if s, ok := m.rt.(runtime.SaveSizer); ok {
		if n := s.MaxSaveBytes(l); n > 0 {
			return n
		}
	}
	if l.MemoryBytes > 0 {
		return l.MemoryBytes
	}
	rsb, err := m.rt.Get(ctx, id)
	if err != nil {
		return 0 // gone: its save fails before writing anything
	}
	st, err := rsb.Stats(ctx)
	if err != nil {
		return 0
	}
	return st.MemoryBytes
}

// forkSaveBytes bounds what a fork of running sandbox id writes to the
// node's disk before its children exist: the parent's memory, and a copy
// of its writable layer (as much as it has allocated: the copy keeps the
// holes) that the children's own disks are copied from.
func (m *Manager) forkSaveBytes(ctx context.Context, id string) int64 {
	n := m.saveBytes(ctx, id)
	if rsb, err := m.rt.Get(ctx, id); err == nil {
		n += rsb.HostDiskBytes()
	}
	return n
}
