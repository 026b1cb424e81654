package snapshot_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// BenchmarkWrite100MiB captures an upper directory of 100 incompressible
// 1 MiB files, what `sandboxd bench` snapshots.
func BenchmarkWrite100MiB(b *testing.B) {
	dir := b.TempDir()
	buf := make([]byte, 1<<20)
	for i := range 100 {
		if _, err := rand.Read(buf); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%03d.bin", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(100 << 20)
	b.ResetTimer()
	for range b.N {
		if _, err := snapshot.Write(context.Background(), io.Discard, dir, snapshot.Manifest{}, nil); err != nil {
			b.Fatal(err)
		}
	}
}
