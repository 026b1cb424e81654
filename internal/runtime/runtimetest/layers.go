package runtimetest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// testLayerBounds: a sparse file comes back from its snapshot sparse, and
// a layer that unpacks to more than the sandbox's disk is refused before
// it fills anything.
func (s *suite) testLayerBounds(t *testing.T) {
	securitytest.Attack(t, "host disk", "a sandbox with a 64 MiB disk snapshots a 256 MiB sparse file; a layer of 80 MiB of data is restored into a 64 MiB disk",
		"the sparse file is restored 256 MiB long within the 64 MiB disk (a VM's kernel sees under 1 MiB of blocks); the 80 MiB layer is refused with ErrTooLarge")
	ctx := ctxT(t, 2*time.Minute)
	lim := runtime.Limits{DiskBytes: 64 << 20}
	sb := s.create(t, runtime.Spec{Limits: lim})
	sh(t, sb, "dd if=/dev/zero of=/workspace/big.sparse bs=1 count=0 seek=268435456 2>/dev/null; echo data > /workspace/small")
	var blob bytes.Buffer
	m, err := sb.Snapshot(ctx, &blob)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if blob.Len() > 1<<20 {
		t.Errorf("the layer of a sparse file is %d bytes", blob.Len())
	}
	r := s.create(t, runtime.Spec{Limits: lim, Layers: []runtime.Layer{{ID: m.ID, R: bytes.NewReader(blob.Bytes())}}})
	if got := sh(t, r, "stat -c %s /workspace/big.sparse; cat /workspace/small"); got != "268435456\ndata\n" {
		t.Fatalf("restored %q", got)
	}
	// gVisor reports st_blocks as the size over 512; a VM's kernel tells
	// the truth.
	if r.Info().Backend != "gvisor" {
		f := strings.Fields(sh(t, r, "stat -c '%b %B' /workspace/big.sparse"))
		var blocks, unit int64
		if len(f) == 2 {
			fmt.Sscan(f[0], &blocks)
			fmt.Sscan(f[1], &unit)
		}
		if blocks*unit > 1<<20 || len(f) != 2 {
			t.Errorf("the restored sparse file uses %v blocks", f)
		}
	}

	// 80 MiB of incompressible data cannot be restored into a 64 MiB disk.
	src := t.TempDir()
	buf := make([]byte, 1<<20)
	for i := range 80 {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint("f", i)), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var big bytes.Buffer
	bm, err := snapshot.Write(ctx, &big, src, snapshot.Manifest{BaseImage: "busybox-fixture"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.rt.Create(ctx, runtime.Spec{ID: s.id(t) + "-big", BaseDir: s.base, BaseImage: "busybox-fixture", Limits: lim,
		Layers: []runtime.Layer{{ID: bm.ID, R: bytes.NewReader(big.Bytes())}}})
	if !errors.Is(err, snapshot.ErrTooLarge) {
		t.Errorf("restore of an 80 MiB layer into a 64 MiB disk: %v, want ErrTooLarge", err)
	}
}
