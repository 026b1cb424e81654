package host

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ReadMeta reads a sandbox directory's meta.json into a backend's meta.
func ReadMeta[M any](dir string) (M, error) {
	var m M
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parse %s/meta.json: %w", dir, err)
	}
	return m, nil
}

// WriteMeta replaces a sandbox directory's meta.json atomically (a reader,
// or the next process after a crash, sees the old file or the new one,
// whole). It holds the sandbox's environment, so only root may read it:
// the new file is 0600 whatever the old one's mode was.
func WriteMeta(dir string, m any) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	f, err := renameio.NewPendingFile(filepath.Join(dir, "meta.json"), renameio.WithPermissions(0o600))
	if err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	defer f.Cleanup()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	return nil
}

// Info is runtime.Sandbox.Info from what the agent said of itself: the
// kernel's release (its first word) and the agent's version.
func Info(backend, platform string, h guest.Hello) runtime.Info {
	kernel := h.Kernel
	if f := strings.Fields(kernel); len(f) > 0 {
		kernel = f[0]
	}
	return runtime.Info{Backend: backend, Platform: platform, Kernel: kernel, Agent: h.Agent}
}
