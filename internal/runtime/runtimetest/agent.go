package runtimetest

import (
	"net/http"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testAgentTransport: the agent's HTTP services are reached as they are
// through AgentTransport, whatever host a request names: its health
// endpoint answers 204.
func (s *suite) testAgentTransport(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	sb := s.create(t, runtime.Spec{})
	tr, err := sb.AgentTransport(ctx)
	if err != nil {
		t.Fatalf("agent transport: %v", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://any-host"+guest.HealthPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET %s through the agent transport: %v", guest.HealthPath, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("GET %s through the agent transport: %s, want 204", guest.HealthPath, res.Status)
	}
}
