// Package cgroup reads and watches the host cgroups that hold a sandbox: its
// memory, CPU and task counts, and a notification when memory use crosses a
// threshold. It handles cgroup v1 (one hierarchy per controller, as on this
// project's development hosts) and the unified v2 hierarchy. It never creates
// or limits cgroups itself: the OCI runtime does that from the bundle's
// linux.resources; this package only observes, so both share one truth.
package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where cgroup file systems are mounted.
const Root = "/sys/fs/cgroup"

// Version of the cgroup hierarchy in use.
type Version int

// Versions.
const (
	V1 Version = 1
	V2 Version = 2
)

// Detect reports the hierarchy resource controllers live in: v2 when the
// unified hierarchy at Root has the memory controller, else v1.
func Detect() Version {
	var st unix.Statfs_t
	if unix.Statfs(Root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return V2
	}
	return V1
}

// Group is one cgroup path (e.g. "/sandboxd/sbx-1") in the host hierarchy.
type Group struct {
	Version Version
	Path    string
}

// New returns the group at path in the detected hierarchy.
func New(path string) Group { return Group{Version: Detect(), Path: path} }

func (g Group) file(controller, name string) string {
	if g.Version == V2 {
		return filepath.Join(Root, g.Path, name)
	}
	return filepath.Join(Root, controller, g.Path, name)
}

// Dirs lists the group's directories that exist.
func (g Group) Dirs() []string {
	var cands []string
	if g.Version == V2 {
		cands = []string{filepath.Join(Root, g.Path)}
	} else {
		ents, _ := os.ReadDir(Root)
		for _, e := range ents {
			cands = append(cands, filepath.Join(Root, e.Name(), g.Path))
		}
	}
	var out []string
	for _, d := range cands {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// Exists says whether any directory of the group is present.
func (g Group) Exists() bool { return len(g.Dirs()) > 0 }

// Remove deletes the group's directories (they must hold no tasks); a
// leftover after a crash is cleaned this way.
func (g Group) Remove() error {
	var errs []error
	for _, d := range g.Dirs() {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Wait waits until no process is left in the group, or fails after
// timeout.
func (g Group) Wait(timeout time.Duration) error { return g.untilEmpty(timeout, nil) }

// Kill sends SIGKILL to every process in the group until none is left, or
// fails after timeout. Processes a sandbox's runtime lost track of (a
// start cut short before it recorded them) end here with their group.
func (g Group) Kill(timeout time.Duration) error {
	return g.untilEmpty(timeout, func(pid int) { _ = unix.Kill(pid, unix.SIGKILL) })
}

// untilEmpty polls the group's processes until there are none, calling
// each (when set) on every one it finds, or fails after timeout.
func (g Group) untilEmpty(timeout time.Duration, each func(pid int)) error {
	deadline := time.Now().Add(timeout)
	for {
		procs, err := g.Procs()
		if err != nil {
			return err
		}
		if len(procs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of cgroup %s still run after %v", procs, g.Path, timeout)
		}
		if each != nil {
			for _, pid := range procs {
				each(pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Procs lists the processes in the group (in any of its hierarchies, on
// cgroup v1), each once. A process counts until its last thread has
// exited: a zombie whose threads are gone is no longer in a group.
func (g Group) Procs() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, d := range g.Dirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return out, fmt.Errorf("cgroup processes: %w", err)
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// Stats are a group's current resource use.
type Stats struct {
	// MemoryBytes is the memory the group holds that the kernel cannot take
	// back without killing something: what is charged to it minus the page
	// cache of files (which is reclaimed at the limit). gVisor's memory
	// file is shared memory and stays counted. It is what `docker stats`
	// and the kubelet's working set report, and what the memory guard acts
	// on: a sandbox that writes or reads files larger than its memory fills
	// the cache, not its memory.
	MemoryBytes int64
	// CacheBytes is the file page cache charged to the group.
	CacheBytes int64
	CPU        time.Duration
	Pids       int64
}

// Stats reads the group's memory, CPU time and task count.
func (g Group) Stats() (Stats, error) {
	var s Stats
	var err error
	if g.Version == V2 {
		if s.MemoryBytes, err = readInt(g.file("", "memory.current")); err != nil {
			return s, fmt.Errorf("cgroup %s memory: %w", g.Path, err)
		}
		s.subtractCache(g.file("", "memory.stat"), "active_file", "inactive_file")
		if v, err := keyed(g.file("", "cpu.stat"), "usage_usec"); err == nil {
			s.CPU = time.Duration(v) * time.Microsecond
		}
		s.Pids, _ = readInt(g.file("", "pids.current"))
		return s, nil
	}
	if s.MemoryBytes, err = readInt(g.file("memory", "memory.usage_in_bytes")); err != nil {
		return s, fmt.Errorf("cgroup %s memory: %w", g.Path, err)
	}
	s.subtractCache(g.file("memory", "memory.stat"), "total_active_file", "total_inactive_file")
	if ns, err := readInt(g.file("cpuacct", "cpuacct.usage")); err == nil {
		s.CPU = time.Duration(ns)
	} else if ns, err := readInt(g.file("cpu,cpuacct", "cpuacct.usage")); err == nil {
		s.CPU = time.Duration(ns)
	}
	s.Pids, _ = readInt(g.file("pids", "pids.current"))
	return s, nil
}

// subtractCache moves the file LRU lists of memory.stat (keys) from
// MemoryBytes to CacheBytes. A stat file that cannot be read leaves the
// charged total: the guard then errs towards acting.
func (s *Stats) subtractCache(stat string, keys ...string) {
	for _, k := range keys {
		if v, err := keyed(stat, k); err == nil {
			s.CacheBytes += v
		}
	}
	s.CacheBytes = min(s.CacheBytes, s.MemoryBytes)
	s.MemoryBytes -= s.CacheBytes
}

// keyed reads "key value" lines (cpu.stat, memory.events).
func keyed(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// MemoryLimit reads the group's hard memory limit (-1: none).
func (g Group) MemoryLimit() (int64, error) {
	if g.Version == V2 {
		return readInt(g.file("", "memory.max"))
	}
	return readInt(g.file("memory", "memory.limit_in_bytes"))
}

// WatchMemory calls fn, one call at a time, whenever the memory the group
// holds (Stats.MemoryBytes, page cache not counted) reaches threshold bytes,
// until ctx ends or the group disappears. v1 uses the kernel's usage
// threshold notification (an eventfd registered through
// cgroup.event_control), so the check runs within microseconds of the
// charged total crossing, and polls while the total stays above it (page
// cache keeps it there without further crossings); v2 sets memory.high to
// threshold — the kernel reclaims and throttles the group there instead of
// killing it — and checks on changes of memory.events.
func (g Group) WatchMemory(ctx context.Context, threshold int64, fn func()) error {
	if g.Version == V2 {
		return g.watchV2(ctx, threshold, fn)
	}
	return g.watchV1(ctx, threshold, fn)
}

// abovePoll is how often a v1 group charged above its threshold is checked.
// The hard limit sits well above the threshold (see the runtimes), so a
// fast allocator still meets the guard before the kernel's OOM killer.
const abovePoll = 25 * time.Millisecond

// afterAct is the pause after fn acted before the group is checked again.
const afterAct = 250 * time.Millisecond

func (g Group) watchV1(ctx context.Context, threshold int64, fn func()) error {
	usage, err := os.Open(g.file("memory", "memory.usage_in_bytes"))
	if err != nil {
		return fmt.Errorf("watch memory of %s: %w", g.Path, err)
	}
	defer usage.Close()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch memory of %s: eventfd: %w", g.Path, err)
	}
	ev := os.NewFile(uintptr(efd), "memory-threshold")
	defer ev.Close()
	ctl := fmt.Sprintf("%d %d %d", efd, usage.Fd(), threshold)
	if err := os.WriteFile(g.file("memory", "cgroup.event_control"), []byte(ctl), 0); err != nil {
		return fmt.Errorf("watch memory of %s: register threshold: %w", g.Path, err)
	}
	stop := context.AfterFunc(ctx, func() { ev.Close() })
	defer stop()
	buf := make([]byte, 8)
	for {
		if _, err := ev.Read(buf); err != nil {
			return nil // closed by ctx
		}
		// The event fires on crossings in both directions. While the
		// charged total stays above the threshold no further event comes,
		// so poll until it is back below.
		for g.Exists() {
			s, err := g.Stats()
			if err != nil || s.MemoryBytes+s.CacheBytes < threshold {
				break
			}
			wait := abovePoll
			if s.MemoryBytes >= threshold {
				fn()
				wait = afterAct // let what fn freed come back first
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		if !g.Exists() {
			return nil // the kernel signals every listener when a group goes
		}
	}
}

// v2Slack is how far below memory.high a v2 group's held memory may be
// when a high event counts: the kernel keeps the group near memory.high by
// reclaiming and throttling, so what it holds hovers at the line rather
// than above it.
func v2Slack(threshold int64) int64 { return threshold / 32 }

func (g Group) watchV2(ctx context.Context, threshold int64, fn func()) error {
	if err := os.WriteFile(g.file("", "memory.high"), []byte(strconv.FormatInt(threshold, 10)), 0); err != nil {
		return fmt.Errorf("watch memory of %s: set memory.high: %w", g.Path, err)
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch memory of %s: inotify: %w", g.Path, err)
	}
	in := os.NewFile(uintptr(ifd), "memory-events")
	defer in.Close()
	if _, err := unix.InotifyAddWatch(ifd, g.file("", "memory.events"), unix.IN_MODIFY); err != nil {
		return fmt.Errorf("watch memory of %s: %w", g.Path, err)
	}
	stop := context.AfterFunc(ctx, func() { in.Close() })
	defer stop()
	buf := make([]byte, 4096)
	last, _ := keyed(g.file("", "memory.events"), "high")
	for {
		if _, err := in.Read(buf); err != nil {
			return nil
		}
		if !g.Exists() {
			return nil
		}
		n, err := keyed(g.file("", "memory.events"), "high")
		if err != nil || n == last {
			continue
		}
		last = n
		// A high event also comes when the kernel merely reclaimed page
		// cache at the line.
		if s, err := g.Stats(); err != nil || s.MemoryBytes >= threshold-v2Slack(threshold) {
			fn()
		}
	}
}
