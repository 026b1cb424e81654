package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed runsc command's error carries what it wrote to the log, not
// what earlier commands did.
func TestRunscFailedSaysWhatRunscPrinted(t *testing.T) {
	log := filepath.Join(t.TempDir(), "agent.log")
	if err := os.WriteFile(log, []byte("an earlier boot\nall fine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := logSize(log)
	f, err := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("creating container: cannot create sandbox\nopen /run/netns/x: no such file or directory\n")
	f.Close()
	err = runscFailed("restore", errors.New("exit status 128"), log, before)
	if msg := err.Error(); !strings.Contains(msg, "no such file or directory") || strings.Contains(msg, "earlier boot") {
		t.Fatalf("error %q: want runsc's own lines only", msg)
	}
	// Nothing new: the log is named, no stale lines.
	err = runscFailed("create", errors.New("exit status 1"), log, logSize(log))
	if msg := err.Error(); strings.Contains(msg, "netns") || !strings.Contains(msg, log) {
		t.Fatalf("error %q: want only the log's path", msg)
	}
}
