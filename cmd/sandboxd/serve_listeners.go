package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
)

// listenerOptions are the flags of the addresses serve listens on (the
// cluster listener's are clusterOptions').
type listenerOptions struct {
	listen      string
	metricsAddr string
}

func (o *listenerOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve the API on (env SANDBOXD_LISTEN)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9090", "address to serve Prometheus /metrics on, apart from the API (env SANDBOXD_METRICS_ADDR); empty disables")
}

// check refuses an address that is not host:port, before serve starts
// anything (it listens last).
func (o *listenerOptions) check() error {
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return flagErrorf("listen", "--listen %q: want host:port: %w", o.listen, err)
	}
	if o.metricsAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
		return flagErrorf("metrics-addr", "--metrics-addr %q: want host:port (or empty): %w", o.metricsAddr, err)
	}
	return nil
}

// listeners are the API's listener and the way home's, with their
// servers; node.run serves them.
type listeners struct {
	ln, homeLn net.Listener
	http, home *http.Server
}

// setupListeners listens on --listen and on the home socket in the data
// dir (sandboxes' http://sandboxd.internal, authenticated like any other
// caller) with the front ends' handlers.
func setupListeners(o listenerOptions, homeSocket string, fe *frontEnds, log *slog.Logger) (*listeners, error) {
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	_ = os.Remove(homeSocket)
	homeLn, err := net.Listen("unix", homeSocket)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: %w", homeSocket, err)
	}
	httpSrv := &http.Server{
		Handler:           fe.host,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	homeSrv := &http.Server{
		Handler:           fe.home,
		ReadHeaderTimeout: httpSrv.ReadHeaderTimeout,
		IdleTimeout:       httpSrv.IdleTimeout,
		ErrorLog:          httpSrv.ErrorLog,
	}
	return &listeners{ln: ln, homeLn: homeLn, http: httpSrv, home: homeSrv}, nil
}

// newRegistry is the registry of /metrics: the process's, the runtime's
// way home, the manager's and the layer cache's; the front ends add
// theirs.
func newRegistry(stor *storage, rt *sandboxRuntime, dom *domain) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	mgr := dom.mgr
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), rt.homeMetrics, mgr.NetworkMetrics(), mgr.PrewarmMetrics(), mgr.Metrics())
	if stor.cache != nil {
		reg.MustRegister(blobCacheCollector{stor.cache})
	}
	return reg
}

// serveMetrics serves reg at /metrics on addr (nothing when addr is empty),
// apart from the API: the metrics name every route with its counts, which
// is for the operator, not for tenants (nor for sandboxes, which reach the
// API through the home socket). Serve errors go to errc.
func serveMetrics(addr string, reg *prometheus.Registry, log *slog.Logger, errc chan<- error) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("serving metrics", "addr", ln.Addr().String())
	go func() { errc <- fmt.Errorf("metrics: %w", srv.Serve(ln)) }()
	return srv, nil
}
