package snapshot_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// TestApplyVerified checks the content address ApplyVerified returns and
// that it refuses a blob that is not the content address asked for.
func TestApplyVerified(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	blob, m := writeLayer(t, src, snapshot.Manifest{})
	ctx := context.Background()
	for _, want := range []string{m.ID, "", "a-name"} {
		dir := t.TempDir()
		id, err := snapshot.ApplyVerified(ctx, bytes.NewReader(blob), want, dir, nil)
		if err != nil || id != m.ID {
			t.Fatalf("want %q: id %q, %v; manifest says %s", want, id, err, m.ID)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "hello" {
			t.Fatalf("want %q: restored f = %q, %v", want, b, err)
		}
	}
	wrong := "sha256:" + strings.Repeat("0", 64)
	if _, err := snapshot.ApplyVerified(ctx, bytes.NewReader(blob), wrong, t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "want "+wrong) {
		t.Fatalf("a blob of another id: %v", err)
	}
}
