package runs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestLogsListAndRemove: the logs a node keeps are listed by run id (a
// .pos file left alone counts), other files are not, and removing a run's
// log takes its .pos file with it.
func TestLogsListAndRemove(t *testing.T) {
	dir := t.TempDir()
	l := Logs{DataDir: dir}
	if ids, err := l.RunIDs(); err != nil || len(ids) != 0 {
		t.Fatalf("RunIDs without a runs directory = %v, %v", ids, err)
	}
	runsDir := filepath.Join(dir, "runs")
	if err := os.MkdirAll(filepath.Join(runsDir, "run_dir.log"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"run_1.log", "run_1.log.pos", "run_2.log", "run_3.log.pos", "notes.txt", "other.log"} {
		if err := os.WriteFile(filepath.Join(runsDir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := l.RunIDs()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if want := []string{"run_1", "run_2", "run_3"}; !slices.Equal(ids, want) {
		t.Fatalf("RunIDs = %v, want %v", ids, want)
	}
	for _, id := range []string{"run_1", "run_3", "run_gone"} {
		if err := l.Remove(id); err != nil {
			t.Fatalf("Remove(%s): %v", id, err)
		}
	}
	if err := l.Remove("../notes.txt"); err == nil {
		t.Fatal("Remove of a path outside the logs succeeded")
	}
	if ids, _ := l.RunIDs(); !slices.Equal(ids, []string{"run_2"}) {
		t.Fatalf("after removing run_1 and run_3: %v", ids)
	}
	if _, err := os.Stat(filepath.Join(runsDir, "notes.txt")); err != nil {
		t.Fatalf("another file went: %v", err)
	}
}
