package repo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/google/renameio/v2"
)

// Defaults of the limits in Options. Everything in a repository comes
// from its account (pushes from sandboxes included) and is hostile: a few
// bytes of push inflate to gigabytes (a blob of zeros), and a few trees
// that name one subtree many times list as billions of paths.
const (
	DefaultMaxReadBytes     = 16 << 20
	DefaultTreeMaxEntries   = 10_000
	DefaultTreeMaxPathBytes = 4 << 20
	DefaultQuotaBytes       = 1 << 30
	DefaultMaxPushBytes     = 512 << 20
	DefaultMaxPushObjects   = 1_000_000
)

var (
	// ErrTooLarge: a file is larger than the server reads whole.
	ErrTooLarge = errors.New("file too large")
	// ErrQuota: a write would take a repository past its account's
	// storage quota.
	ErrQuota = errors.New("repository quota exceeded")
	// ErrReadOnly: the writer may read the repository but not write it (a
	// member writing into its organization's repository).
	ErrReadOnly = errors.New("repository is read-only for this account")
)

// TooLargeError is a file read refused by its size (ErrTooLarge).
type TooLargeError struct {
	Path  string
	Size  int64
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s has %d bytes, more than the %d read whole", e.Path, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) match.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// QuotaError is a write refused by the owner's repository quota
// (ErrQuota). Its fields are for the caller's message.
type QuotaError struct {
	Owner  string
	Used   int64 // bytes the repository takes on disk now
	Adding int64 // bytes the write would add (uncompressed)
	Quota  int64
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("repository of %s takes %d bytes; adding %d would pass its quota of %d", e.Owner, e.Used, e.Adding, e.Quota)
}

// Is makes errors.Is(err, ErrQuota) match.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Limits are the bounds the Manager applies (see Options).
type Limits struct {
	MaxReadBytes     int64
	TreeMaxEntries   int
	TreeMaxPathBytes int64
	QuotaBytes       int64
	MaxPushBytes     int64
	MaxPushObjects   int64
}

// Limits returns the bounds in force; 0 means unlimited.
func (m *Manager) Limits() Limits { return m.limits }

// Usage is the disk space account's repository takes (0 when it has
// none), counted in allocated blocks like du(1) — the same count the push
// hook makes, so uploads and pushes agree on what the quota sees.
func (m *Manager) Usage(ctx context.Context, accountID string) (int64, error) {
	p, err := m.Synced(ctx, accountID)
	if err != nil {
		return 0, err
	}
	n, err := diskUsage(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return n, err
}

// diskUsage sums the allocated size of everything under dir.
func diskUsage(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != dir {
				return nil // removed meanwhile (a loose object packed by gc)
			}
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return total, nil
}

// checkQuota refuses to add adding bytes to owner's repository at
// repoPath when that would pass the quota.
func (m *Manager) checkQuota(owner, repoPath string, adding int64) error {
	if m.limits.QuotaBytes <= 0 {
		return nil
	}
	used, err := diskUsage(repoPath)
	if err != nil {
		return err
	}
	if used+adding > m.limits.QuotaBytes {
		return &QuotaError{Owner: owner, Used: used, Adding: adding, Quota: m.limits.QuotaBytes}
	}
	return nil
}

// preReceiveHook is the pre-receive hook of every push (core.hooksPath,
// set for http-backend only). receive-pack runs it after the pack arrived
// in the quarantine directory (inside objects/, so du of the repository
// counts it) and before any ref moves or any object joins the repository:
// a refused push leaves nothing behind. It refuses pushes of more objects
// than SANDBOXD_MAX_PUSH_OBJECTS, and pushes that make the repository take
// more than SANDBOXD_REPO_QUOTA_KIB; 0 disables either. Pushes that add
// nothing (deleting a branch) always pass, so a full repository can be
// cleaned up.
const preReceiveHook = `#!/bin/sh
# Installed by sandboxd; rewritten at every start.
q="${GIT_QUARANTINE_PATH:-}"
[ -n "$q" ] && [ -d "$q" ] || exit 0
n=0
for idx in "$q"/pack/*.idx; do
	[ -f "$idx" ] || continue
	c=$(git show-index <"$idx" | wc -l) || exit 1
	n=$((n + c))
done
loose=$(find "$q" -path "$q/pack" -prune -o -type f -print | wc -l)
n=$((n + loose))
[ "$n" -gt 0 ] || exit 0
max="${SANDBOXD_MAX_PUSH_OBJECTS:-0}"
if [ "$max" -gt 0 ] && [ "$n" -gt "$max" ]; then
	echo "sandboxd: push refused: it has $n objects, more than the $max one push may have" >&2
	exit 1
fi
quota="${SANDBOXD_REPO_QUOTA_KIB:-0}"
if [ "$quota" -gt 0 ]; then
	used=$(du -sk . | cut -f1)
	if [ "$used" -gt "$quota" ]; then
		echo "sandboxd: push refused: the repository would take $((used / 1024)).$((used % 1024 * 10 / 1024)) MiB, over the account's quota of $((quota / 1024)) MiB; nothing was changed" >&2
		exit 1
	fi
fi
exit 0
`

// hooksDir is where the push hooks live, beside the repositories (account
// ids are UUIDs, so it cannot collide with one).
func (m *Manager) hooksDir() string { return filepath.Join(m.root, ".hooks") }

// installHooks writes the push hooks, atomically: several Managers (or
// processes) may share a root.
func (m *Manager) installHooks() error {
	dir := m.hooksDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create hooks directory: %w", err)
	}
	// Static 0755, not the umask's: git runs the hook as whoever serves
	// the push.
	pf, err := renameio.NewPendingFile(filepath.Join(dir, "pre-receive"), renameio.WithTempDir(dir), renameio.WithStaticPermissions(0o755))
	if err != nil {
		return fmt.Errorf("write pre-receive hook: %w", err)
	}
	defer func() { _ = pf.Cleanup() }() // a no-op once installed
	if _, err := pf.WriteString(preReceiveHook); err != nil {
		return fmt.Errorf("write pre-receive hook: %w", err)
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("install pre-receive hook: %w", err)
	}
	return nil
}

// pushLimit is the largest pack one push may send (0: no limit): the push
// limit, and never more than the whole quota.
func (m *Manager) pushLimit() int64 {
	limit := m.limits.MaxPushBytes
	if q := m.limits.QuotaBytes; q > 0 && (limit <= 0 || q < limit) {
		limit = q
	}
	return limit
}

// pushEnv is the environment that bounds a push by http-backend's
// receive-pack: git configuration through GIT_CONFIG_COUNT (which git
// passes on to receive-pack and index-pack) and the hook's limits.
func (m *Manager) pushEnv() []string {
	cfg := [][2]string{
		{"core.hooksPath", m.hooksDir()},
		// Keep every push as a pack (never exploded into loose objects,
		// which can take far more room than the pack did): the hook counts
		// and measures what arrived, and the quota sees what is kept.
		{"receive.unpackLimit", "1"},
	}
	// index-pack stops reading past this, before the hook runs.
	if limit := m.pushLimit(); limit > 0 {
		cfg = append(cfg, [2]string{"receive.maxInputSize", strconv.FormatInt(limit, 10)})
	}
	env := []string{"GIT_CONFIG_COUNT=" + strconv.Itoa(len(cfg))}
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	return append(env,
		"SANDBOXD_MAX_PUSH_OBJECTS="+strconv.FormatInt(max(m.limits.MaxPushObjects, 0), 10),
		"SANDBOXD_REPO_QUOTA_KIB="+strconv.FormatInt(max(m.limits.QuotaBytes, 0)/1024, 10),
	)
}

// withDefaults fills zero fields with the defaults and turns negative ones
// into 0 (unlimited).
func (l Limits) withDefaults() Limits {
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	l.MaxReadBytes = pick(l.MaxReadBytes, DefaultMaxReadBytes)
	l.TreeMaxEntries = int(pick(int64(l.TreeMaxEntries), DefaultTreeMaxEntries))
	l.TreeMaxPathBytes = pick(l.TreeMaxPathBytes, DefaultTreeMaxPathBytes)
	l.QuotaBytes = pick(l.QuotaBytes, DefaultQuotaBytes)
	l.MaxPushBytes = pick(l.MaxPushBytes, DefaultMaxPushBytes)
	l.MaxPushObjects = pick(l.MaxPushObjects, DefaultMaxPushObjects)
	return l
}
