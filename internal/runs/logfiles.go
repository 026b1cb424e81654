package runs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A run's log is DATA_DIR/runs/<id>.log, with <id>.log.pos beside it
// (runLog). Both go together.
const (
	logSuffix = ".log"
	posSuffix = ".log.pos"
)

// RunIDs returns the ids of the runs this node keeps a log of (or what is
// left of one, its .pos file), in no particular order: the retention sweep
// deletes those whose runs are gone.
func (l Logs) RunIDs() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.DataDir, "runs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list run logs: %w", err)
	}
	seen := map[string]bool{}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), posSuffix)
		if !ok {
			id, ok = strings.CutSuffix(e.Name(), logSuffix)
		}
		if !ok || !validRunID(id) || seen[id] || !e.Type().IsRegular() {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}

// Remove deletes run id's log and its .pos file; what is already gone is
// no error.
func (l Logs) Remove(id string) error {
	if !validRunID(id) {
		return fmt.Errorf("remove log of run %q: not a run id", id)
	}
	path := LogPath(l.DataDir, id)
	var errs []error
	for _, p := range []string{path, path + ".pos"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove log of run %s: %w", id, err)
	}
	return nil
}

// validRunID reports whether id can name a run's log: ids come from the
// database or the directory, and a path in one must still not leave it.
func validRunID(id string) bool {
	return strings.HasPrefix(id, "run_") && !strings.ContainsAny(id, "/\\")
}
