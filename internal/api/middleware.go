package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/httprec"
)

type ctxKey int

const (
	requestIDKey ctxKey = iota
	principalKey
	viaClusterKey
	bodyKey
)

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

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
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
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
		h.Set("Access-Control-Expose-Headers", NextCursorHeader)
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
					log.ErrorContext(r.Context(), "handler panicked", "panic", p, "request_id", requestID(r.Context()), "path", r.URL.Path)
					if rec.Status == 0 {
						writeJSON(rec, http.StatusInternalServerError, ErrorBody{Status: "error", Error: "Internal server error"})
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
				log.LogAttrs(r.Context(), slog.LevelInfo, "http request",
					slog.String("request_id", requestID(r.Context())),
					slog.String("method", r.Method),
					slog.String("route", pattern),
					slog.Int("status", status),
					slog.Int64("bytes", rec.Bytes),
					slog.Duration("elapsed", elapsed),
				)
			}()
			next.ServeHTTP(rec, r)
		})
	}
}

// checkScope refuses, with 403 and the reason, a request that the key's
// scope does not cover: a sandbox's own key (RECOUP_API_KEY, in the hands
// of the untrusted code inside) only reads, so that code cannot extend its
// sandbox, start sandboxes or runs, upload, or change or delete the
// account's environment. A route that acts though its method is GET (the
// exec websocket, a sandbox's files) counts as a POST, for the reason it
// gives.
func checkScope(r *http.Request, p auth.Principal, acts string) error {
	method, what := r.Method, r.Method+" "+r.URL.Path
	if acts != "" {
		method, what = http.MethodPost, what+" ("+acts+")"
	}
	if err := p.MayCall(method); err != nil {
		return ScopeError(what)
	}
	return nil
}
