package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
	"github.com/google/uuid"
)

// NodeID returns this node's id, stable across restarts: it is kept in the
// data dir and created on first start.
func NodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "node-id")
	data, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(data))
		if _, perr := uuid.Parse(id); perr != nil {
			return "", fmt.Errorf("node id in %s is not a UUID: %q", path, id)
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read node id: %w", err)
	}
	id := uuid.NewString()
	if err := renameio.WriteFile(path, []byte(id+"\n"), 0o600, renameio.WithTempDir(dataDir)); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	return id, nil
}
