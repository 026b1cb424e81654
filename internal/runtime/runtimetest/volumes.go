package runtimetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testVolumes: a volume image (made as package volumes makes one) mounted
// read-write keeps what a sandbox wrote after the sandbox is destroyed; a
// second sandbox mounts it read-only at another path and reads it, and
// cannot write it; a write past the volume's size fails with ENOSPC, not
// into the sandbox's own disk; an image grown since it was formatted is
// grown when mounted read-write; the mount is nosuid. A path the runtime
// does not allow is refused before anything starts.
func (s *suite) testVolumes(t *testing.T) {
	Require(t, "mkfs.ext4", "debugfs", "resize2fs")
	img := filepath.Join(t.TempDir(), "vol.img")
	if err := ext4.Create(ctxT(t, time.Minute), img, 64<<20, ext4.Options{Label: "sandboxd-vol", BlockSize: 4096, RootOwner: true, RootMode: 0o1777, Lazy: true}); err != nil {
		t.Fatal(err)
	}
	// Grown since formatted: the read-write mount grows the file system.
	if err := os.Truncate(img, 96<<20); err != nil {
		t.Fatal(err)
	}
	w := s.create(t, runtime.Spec{Volumes: []runtime.VolumeMount{{Image: img, Path: "/data"}}})
	out := sh(t, w, "stat -c %a /data; echo kept > /data/note; mkdir -p /data/d && echo deep > /data/d/f; "+
		"df -k /data | tail -n 1 | awk '{print $2}'; grep ' /data ' /proc/mounts | grep -o nosuid; sync")
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != "1777" || f[2] != "nosuid" {
		t.Fatalf("the volume as mounted: %q; want mode 1777 and nosuid", out)
	}
	if kb := atoi(t, f[1]); kb < 80<<10 {
		t.Errorf("the volume's file system is %d KiB after its image grew to 96 MiB: not grown", kb)
	}
	o := run(t, w, runtime.ExecRequest{Cmd: []string{"sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=200 2>&1 | grep -o 'No space left on device'; rm -f /data/big; echo alive"}, Timeout: 2 * time.Minute})
	if !strings.Contains(o.stdout, "No space left on device") || !strings.Contains(o.stdout, "alive") {
		t.Errorf("a write past the volume's size: %q %v; want ENOSPC", o.stdout, o.err)
	}
	if err := w.Destroy(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}

	r := s.create(t, runtime.Spec{Volumes: []runtime.VolumeMount{{Image: img, Path: "/srv/ro", ReadOnly: true}}})
	if got := sh(t, r, "cat /srv/ro/note /srv/ro/d/f"); got != "kept\ndeep\n" {
		t.Errorf("read back through a read-only mount: %q", got)
	}
	if o := run(t, r, runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo x > /srv/ro/other"}}); o.err != nil || o.res.ExitCode == 0 {
		t.Errorf("a write to a read-only volume: exit %d err %v; want it refused", o.res.ExitCode, o.err)
	}

	for _, bad := range []string{"/proc/x", "/", "/a b", "relative"} {
		_, err := s.rt.Create(ctxT(t, time.Minute), runtime.Spec{ID: s.id(t), BaseDir: s.base, Volumes: []runtime.VolumeMount{{Image: img, Path: bad}}})
		if err == nil {
			t.Errorf("a volume at %q was mounted", bad)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}
