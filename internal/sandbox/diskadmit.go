package sandbox

import (
	"context"
	"fmt"

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
//	free - reserve - Σ(limit - allocated of each active sandbox) >= limit
//
// Allocated bytes are already out of free, so a sandbox's writes do not
// change the balance; only creates and destroys do. The check is node-local
// (it is this node's disk), so a mutex held from the check to the row's
// insert makes simultaneous creates see each other: a pending row counts
// with its whole limit.

// diskFree is the space available to unprivileged writers on dir's
// filesystem (statfs f_bavail): what is left before root's reserve.
func diskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// admitDisk checks the node's disk for n more sandboxes; on success the
// caller holds m.diskMu until their rows are recorded, and must call the
// returned release.
func (m *Manager) admitDisk(ctx context.Context, n int) (release func(), err error) {
	limit := m.cfg.Settings.Limits.DiskBytes
	m.diskMu.Lock()
	release = m.diskMu.Unlock
	if m.cfg.DataDir == "" {
		return release, nil
	}
	free, err := m.diskFreeFn(m.cfg.DataDir)
	if err != nil {
		release()
		return nil, fmt.Errorf("check free disk: %w", err)
	}
	reserve := m.cfg.Settings.DiskReserveBytes
	if limit <= 0 {
		// No per-sandbox limit: nothing to promise, but the node's own
		// reserve still holds.
		if free < reserve {
			release()
			return nil, errdefs.Newf(errdefs.ErrQuota, "the server is out of disk space (%d MiB free, %d MiB kept for the service); try again later", free>>20, reserve>>20)
		}
		return release, nil
	}
	active, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxPending, store.SandboxRunning, store.SandboxStopping)
	if err != nil {
		release()
		return nil, fmt.Errorf("list this node's sandboxes: %w", err)
	}
	warm := m.cfg.Settings.WarmSandboxes
	if pw, ok := m.rt.(runtime.Prewarmer); ok {
		warm += pw.PrewarmStats().Kept
	}
	promised := int64(warm) * limit
	for _, sb := range active {
		owed := limit
		if rsb, err := m.rt.Get(ctx, sb.ID); err == nil {
			owed -= rsb.HostDiskBytes()
		}
		promised += max(0, owed)
	}
	if left := free - reserve - promised; left < int64(n)*limit {
		release()
		what := "another sandbox"
		if n > 1 {
			what = fmt.Sprintf("%d more sandboxes", n)
		}
		return nil, errdefs.Newf(errdefs.ErrQuota, "the server's disk cannot hold %s of %d MiB: %d MiB free, %d MiB promised to its %d active and %d warm sandboxes, %d MiB kept for the service; try again later",
			what, limit>>20, free>>20, promised>>20, len(active), warm, reserve>>20)
	}
	return release, nil
}
