package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAllocatedCountsBlocks: a sandbox disk is a sparse file, so density
// counts the blocks a file holds, not its size.
func TestAllocatedCountsBlocks(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := allocated(dir); got < 1<<20 || got > 4<<20 {
		t.Fatalf("allocated %d bytes for 1 MiB written into a 64 MiB sparse file", got)
	}
}

func TestHostFigures(t *testing.T) {
	total, avail, err := meminfo()
	if err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("meminfo: total %d, available %d, %v", total, avail, err)
	}
	a := hostCPU()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	if b := hostCPU(); a <= 0 || b < a {
		t.Fatalf("host CPU time went from %v to %v (%d)", a, b, x)
	}
}
