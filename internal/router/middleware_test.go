package router

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRequestLevel: a request's line is debug unless it failed on the
// server (warn) or was slow to start answering (info), whatever its 4xx.
func TestRequestLevel(t *testing.T) {
	for _, tc := range []struct {
		status int
		wait   time.Duration
		want   slog.Level
	}{
		{200, time.Millisecond, slog.LevelDebug},
		{404, time.Millisecond, slog.LevelDebug},
		{429, time.Millisecond, slog.LevelDebug},
		{101, time.Millisecond, slog.LevelDebug},
		{200, SlowRequest, slog.LevelDebug},
		{200, SlowRequest + time.Millisecond, slog.LevelInfo},
		{400, 3 * time.Second, slog.LevelInfo},
		{500, time.Millisecond, slog.LevelWarn},
		{503, time.Minute, slog.LevelWarn},
	} {
		if got := requestLevel(tc.status, tc.wait); got != tc.want {
			t.Errorf("status %d after %v: %v, want %v", tc.status, tc.wait, got, tc.want)
		}
	}
}

// TestRequestLogLines: through the middleware, ordinary requests log at
// debug, a 5xx at warn; a panic is an error line with its value and no
// stack, the stack one debug line's attribute.
func TestRequestLogLines(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	mux.HandleFunc("/down", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { panic("the handler broke") })
	h := withRequestID(withObservability(log, newMetrics(prometheus.NewRegistry()))(mux))
	for _, path := range []string{"/ok", "/missing", "/down", "/boom"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	find := func(substr string) string {
		for _, l := range lines {
			if strings.Contains(l, substr) {
				return l
			}
		}
		t.Fatalf("no line with %s in:\n%s", substr, out.String())
		return ""
	}
	for substr, level := range map[string]string{
		"status=200":                "DEBUG",
		"status=404":                "DEBUG",
		"status=502":                "WARN",
		"status=500":                "WARN",
		`msg="handler panicked"`:    "ERROR",
		`msg="handler panic stack"`: "DEBUG",
	} {
		if l := find(substr); !strings.Contains(l, "level="+level+" ") {
			t.Errorf("%s: %s, want level %s", substr, l, level)
		}
	}
	if l := find(`msg="handler panicked"`); !strings.Contains(l, `panic="the handler broke"`) || strings.Contains(l, "goroutine") || strings.Contains(l, ".go:") {
		t.Errorf("the panic's error line: %s", l)
	}
	if l := find(`msg="handler panic stack"`); !strings.Contains(l, "middleware_test.go") {
		t.Errorf("the stack line has no stack: %s", l)
	}
	for _, l := range lines {
		if strings.Contains(l, "goroutine ") && !strings.Contains(l, "level=DEBUG") {
			t.Errorf("a stack above debug: %s", l)
		}
	}
}
