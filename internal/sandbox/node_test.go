package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestNodeIDIsStable(t *testing.T) {
	dir := t.TempDir()
	first, err := NodeID(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := NodeID(dir)
	if err != nil || again != first {
		t.Fatalf("second read %q, %v; want %q", again, err, first)
	}
	if other, _ := NodeID(t.TempDir()); other == first {
		t.Fatal("two data dirs share a node id")
	}
	if err := os.WriteFile(filepath.Join(dir, "node-id"), []byte("not-a-uuid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NodeID(dir); err == nil || !strings.Contains(err.Error(), "not a UUID") {
		t.Fatalf("corrupt node id accepted: %v", err)
	}
}

func TestNewIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := store.NewID("sbx_")
		if !strings.HasPrefix(id, "sbx_") || len(id) != 30 || seen[id] || strings.ToLower(id) != id {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
}
