package router

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/httprec"
)

// withRequestID tags each request with an id (the caller's X-Request-Id when
// it sends a sane one) that appears in logs and in the response headers.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if id == "" || len(id) > 64 {
			var b [8]byte
			_, _ = rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(edge.WithRequestID(r.Context(), id)))
	})
}

// withCORS adds the contract's CORS headers to every response and answers
// every OPTIONS request with 200 and no body.
func withCORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS, PATCH")
		h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, X-Requested-With, x-api-key")
		// A browser's script reads a list's next page only if it may.
		h.Set("Access-Control-Expose-Headers", contract.NextCursorHeader)
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusOK)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// metrics are the HTTP metrics exported at /metrics.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_http_requests_total",
			Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// SlowRequest is how long an answer may take to start (its header sent)
// before its request is logged at info; see requestLevel.
const SlowRequest = time.Second

// requestLevel is the level of a request's log line. Every request is
// counted on /metrics by route and status; the log keeps what an operator
// should read: an answer 5xx at warn (the error behind an internal error
// has its own error line), a success or a client's mistake (4xx) at info
// when it took more than SlowRequest to start answering, else at debug.
// A streamed answer (exec output, a run's log, a websocket) counts from
// when it starts, not for how long it streams.
func requestLevel(status int, wait time.Duration) slog.Level {
	switch {
	case status >= 500:
		return slog.LevelWarn
	case wait > SlowRequest:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// withObservability logs each request, records metrics, and turns a panic
// into a 500 that leaks nothing.
func withObservability(log *slog.Logger, m *metrics) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rec := &httprec.Recorder{ResponseWriter: w}
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					logPanic(r, log, p)
					if rec.Status == 0 {
						contract.WriteError(rec, &edge.Error{Status: http.StatusInternalServerError, Msg: edge.InternalMessage})
					}
				}
				pattern := "unmatched"
				if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
					pattern = rc.RoutePattern()
				}
				status := rec.Status
				if status == 0 {
					status = http.StatusOK
				}
				elapsed := time.Since(start)
				m.requests.WithLabelValues(pattern, r.Method, strconv.Itoa(status)).Inc()
				m.duration.WithLabelValues(pattern, r.Method).Observe(elapsed.Seconds())
				wait := elapsed
				if !rec.HeaderAt.IsZero() {
					wait = rec.HeaderAt.Sub(start)
				}
				log.LogAttrs(r.Context(), requestLevel(status, wait), "http request",
					slog.String("request_id", edge.RequestID(r.Context())),
					slog.String("method", r.Method),
					slog.String("route", pattern),
					slog.Int("status", status),
					slog.Int64("bytes", rec.Bytes),
					slog.Duration("elapsed", elapsed),
					slog.Duration("first_byte", wait),
				)
			}()
			next.ServeHTTP(rec, r)
		})
	}
}

// logPanic logs a handler's panic as one error line with its value, and
// its stack at debug as one attribute: a multi-line stack in an error line
// breaks every line-based log reader.
func logPanic(r *http.Request, log *slog.Logger, p any) {
	id := edge.RequestID(r.Context())
	log.ErrorContext(r.Context(), "handler panicked", "panic", fmt.Sprint(p), "request_id", id, "path", r.URL.Path)
	log.DebugContext(r.Context(), "handler panic stack", "request_id", id, "stack", string(debug.Stack()))
}
