package host

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// movedManifest is the file in a moved sandbox's directory (runtime.Mover)
// holding what its backend's restore needs besides the saved files.
const movedManifest = "moved.json"

// WriteMovedManifest writes v as the manifest of the moved sandbox's
// directory dir, private to root (it holds the agent's session secret).
func WriteMovedManifest(dir string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, movedManifest), b, 0o600)
}

// ReadMovedManifest reads the manifest WriteMovedManifest wrote in dir.
func ReadMovedManifest[M any](dir string) (M, error) {
	var m M
	b, err := os.ReadFile(filepath.Join(dir, movedManifest))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parse %s: %w", movedManifest, err)
	}
	return m, nil
}
