package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/store"
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

// heartbeat records that this node is alive until ctx ends, so that other
// nodes (and operators) can tell live nodes from dead ones.
func heartbeat(ctx context.Context, st *store.Store, node store.Node, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := st.HeartbeatNode(ctx, node.ID, now); err != nil && ctx.Err() == nil {
				log.Warn("node heartbeat", "node_id", node.ID, "err", err)
			}
		}
	}
}
