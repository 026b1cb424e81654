package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"riverqueue.com/riverui"
)

// UI is River's own web UI (riverui) on this client's database, serving
// under prefix (e.g. "/riverui"): the queues and jobs of every node, with
// cancel, retry and delete. It is for operators, never tenants (job
// arguments name runs and sandboxes of every account): whoever mounts it
// puts it behind the operator's credential. Its background queries run
// until ctx ends.
func (c *Client) UI(ctx context.Context, prefix string, log *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(c.river, nil),
		Logger:    log,
		Prefix:    prefix,
	})
	if err != nil {
		return nil, fmt.Errorf("build River's UI: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("start River's UI: %w", err)
	}
	return h, nil
}
