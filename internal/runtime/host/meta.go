package host

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

// WriteMeta replaces a sandbox directory's meta.json atomically; it holds
// the sandbox's environment, so only root may read it.
func WriteMeta(dir string, m any) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
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
