package e2e

import (
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// diskUse is the space every file under dir really uses on dir's file
// system (allocated blocks, so sparse disk images count what they hold;
// the sandboxes' loop-mounted disks and overlays are not counted twice).
func diskUse(t *testing.T, dir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // files come and go while sandboxes start and end
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// TestSparseSnapshot: a 256 MiB sparse file that uses no blocks comes back
// from its snapshot still sparse, and the host's data dir does not grow by
// its apparent size.
func TestSparseSnapshot(t *testing.T) {
	securitytest.Attack(t, "host disk", "a run leaves a 256 MiB sparse file (no blocks) in a sandbox with a 256 MiB disk; the next sandbox restores it",
		"the next sandbox sees it 256 MiB long with under 1 MiB of blocks, the blob is under 1 MiB and the host's data dir grows by far less than 256 MiB")
	s := startServer(t, filepath.Join(t.TempDir(), "sparse.db"))
	k := s.createKey(s.createAccount("sparse", false).ID)
	before := diskUse(t, s.dataDir)

	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c",
		"mkdir -p /data && dd if=/dev/zero of=/data/big.sparse bs=1 count=0 seek=268435456 2>/dev/null && stat -c '%s %b' /data/big.sparse"}})
	r := s.waitRun(k, sb["runId"].(string), 2*time.Minute)
	if r.Status != "COMPLETED" || r.Output["exitCode"] != 0.0 || r.Output["snapshotId"] == nil {
		t.Fatalf("first run %+v", r)
	}
	if f := strings.Fields(r.Output["stdout"].(string)); len(f) < 2 || f[0] != "268435456" {
		t.Fatalf("the sparse file in the first sandbox: %q", r.Output["stdout"])
	}
	if n := diskUse(t, filepath.Join(s.dataDir, "blobs")); n > 1<<20 {
		t.Errorf("the snapshot blobs take %d bytes for a file with no data", n)
	}

	// gVisor's stat inside reports st_blocks as the size over 512, so the
	// restored layer is looked at from the host, in the runtime's
	// directory of the sandbox that restored it.
	sb2 := s.createSandbox(k, map[string]any{"command": "stat", "args": []string{"-c", "%s", "/data/big.sparse"}})
	r = s.waitRun(k, sb2["runId"].(string), 2*time.Minute)
	if r.Status != "COMPLETED" || r.Output["exitCode"] != 0.0 || r.Output["stdout"] != "268435456\n" {
		t.Fatalf("second run %+v", r)
	}
	restored, _ := filepath.Glob(filepath.Join(s.dataDir, "runtime", "gvisor", "sandboxes", "*", "layer", "lower-*", "data", "big.sparse"))
	if len(restored) == 0 {
		t.Fatal("no restored layer holds the sparse file")
	}
	for _, p := range restored {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Size != 256<<20 || st.Blocks*512 > 1<<20 {
			t.Errorf("restored %s: size %d, %d bytes of blocks (%v); want 268435456 bytes in under 1 MiB", p, st.Size, st.Blocks*512, err)
		}
	}
	if grew := diskUse(t, s.dataDir) - before; grew > 96<<20 {
		t.Errorf("the data dir grew by %d MiB", grew>>20)
	} else {
		t.Logf("the data dir grew by %d MiB", grew>>20)
	}
}

// TestDiskLimitRun: a run that writes more than --sandbox-disk-mib fails
// with a clear error (the disk is full inside; its snapshot is past the
// account's snapshot quota), and the host's data dir stays bounded.
func TestDiskLimitRun(t *testing.T) {
	securitytest.Attack(t, "host disk", "a run writes 100 MiB of random data into a sandbox with --sandbox-disk-mib 64, on an account with --account-snapshot-mib 16",
		"the write stops at the disk limit inside, the run fails with an error naming the 16 MiB snapshot quota, no blob is stored and the data dir grows by less than the disk limit")
	s := startServer(t, filepath.Join(t.TempDir(), "disk.db"), "--sandbox-disk-mib", "64", "--account-snapshot-mib", "16")
	k := s.createKey(s.createAccount("filler", false).ID)
	before := diskUse(t, s.dataDir)

	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c",
		"mkdir -p /data && dd if=/dev/urandom of=/data/fill bs=1048576 count=100"}})
	r := s.waitRun(k, sb["runId"].(string), 3*time.Minute)
	if r.Status != "FAILED" || r.Output["exitCode"] == 0.0 {
		t.Fatalf("run %+v", r)
	}
	if stderr, _ := r.Output["stderr"].(string); !strings.Contains(stderr, "No space left on device") {
		t.Errorf("the command's stderr does not say the disk is full: %q", stderr)
	}
	msg, _ := r.Error["message"].(string)
	if !strings.Contains(msg, "snapshot storage quota of 16 MiB") || strings.Contains(msg, s.dataDir) {
		t.Errorf("run error %q", msg)
	}
	if n := diskUse(t, filepath.Join(s.dataDir, "blobs")); n > 1<<20 {
		t.Errorf("%d bytes of blobs stored past the quota", n)
	}
	if grew := diskUse(t, s.dataDir) - before; grew > 64<<20 {
		t.Errorf("the data dir grew by %d MiB", grew>>20)
	} else {
		t.Logf("the data dir grew by %d MiB", grew>>20)
	}

	// A run within the quota still saves its work.
	sb2 := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "mkdir -p /data && echo small > /data/small"}})
	if r := s.waitRun(k, sb2["runId"].(string), 2*time.Minute); r.Status != "COMPLETED" || r.Output["snapshotId"] == nil {
		t.Fatalf("small run %+v", r)
	}
}
