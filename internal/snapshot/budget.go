package snapshot

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// ErrTooLarge is returned (wrapped in an errdefs message naming the limit)
// when a capture, apply or flatten would go past its Budget.
var ErrTooLarge = errors.New("snapshot: layer exceeds its size limit")

// entryCost is what one entry costs a Budget besides its data: its inode
// and directory entry.
const entryCost = 512

// Budget bounds the uncompressed bytes that captures, applies and flattens
// charged to it may use: file data actually stored (holes are free) plus
// entryCost per entry. Entries an Apply removes are refunded, so a chain
// of layers that rewrites the same file costs what is left at the end, not
// the sum of every generation. One Budget may be shared by the several
// layers that fill one disk; it is not safe for concurrent use.
type Budget struct {
	max  int64 // <= 0: unlimited
	used int64
}

// NewBudget returns a Budget of max bytes; max <= 0 is unlimited.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// Max is the budget's limit in bytes, 0 when unlimited.
func (b *Budget) Max() int64 {
	if b == nil || b.max <= 0 {
		return 0
	}
	return b.max
}

// Used is what has been charged so far.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used
}

// charge takes n bytes, refusing when that would pass the limit. A nil
// Budget is unlimited.
func (b *Budget) charge(n int64) error {
	if b == nil {
		return nil
	}
	if b.max > 0 && b.used+n > b.max {
		return b.tooLarge()
	}
	b.used += n
	return nil
}

// refund gives back n bytes charged before.
func (b *Budget) refund(n int64) {
	if b == nil {
		return
	}
	b.used = max(b.used-n, 0)
}

func (b *Budget) tooLarge() error {
	return errdefs.Wrap(nil, ErrTooLarge, fmt.Sprintf("the filesystem snapshot is larger than the sandbox's disk limit of %d MiB", mib(b.max)))
}

// full explains a write that found its disk full as ErrTooLarge.
func (b *Budget) full(cause error) error {
	msg := "there is no space left to restore the filesystem snapshot"
	if m := b.Max(); m > 0 {
		msg = fmt.Sprintf("the filesystem snapshot does not fit in the sandbox's disk limit of %d MiB", mib(m))
	}
	return errdefs.Wrap(nil, fmt.Errorf("%w: %w", ErrTooLarge, cause), msg)
}

func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// storedBytes is what a regular file's data really occupies: its allocated
// blocks, never more than its size (holes cost nothing).
func storedBytes(st *unix.Stat_t) int64 {
	return min(st.Blocks*512, st.Size)
}

// CheckFree makes sure the file system holding dir has at least need bytes
// free for scratch work, so a flatten or a restore refuses at once instead
// of filling the host's disk halfway through.
func CheckFree(dir string, need int64) error {
	if need <= 0 {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	free := int64(fs.Bavail) * fs.Bsize
	if free < need {
		return errdefs.New(nil, fmt.Sprintf("the server has %d MiB of free disk space for snapshot work, less than the %d MiB the sandbox's disk limit needs; try again later", free>>20, mib(need)))
	}
	return nil
}
