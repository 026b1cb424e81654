package gvisor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveTrialDirs: a start removes the directories that trials of a
// process that died left in the state dir, and keeps the trials' cached
// answers.
func TestRemoveTrialDirs(t *testing.T) {
	state := t.TempDir()
	left := filepath.Join(state, "probe-123", "runsc")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	cached := filepath.Join(state, "probe-0123456789abcdef.json")
	if err := os.WriteFile(cached, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	removeTrialDirs(state)
	if _, err := os.Stat(filepath.Join(state, "probe-123")); !os.IsNotExist(err) {
		t.Fatalf("a trial's directory is left: %v", err)
	}
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("a cached answer went: %v", err)
	}
}
