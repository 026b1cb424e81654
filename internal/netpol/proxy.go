package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ProxyOptions configure NewProxy.
type ProxyOptions struct {
	// Prefix is the path the handler is mounted under, up to the sandbox
	// id: requests look like Prefix + "{id}/proxy/{port}/{rest}". Default
	// "/api/sandboxes/".
	Prefix string
	// Resolve returns the guest address of sandbox id (Network.GuestAddr).
	// An error answers 404: the caller has already authenticated the
	// request, and the sandbox is gone or has no network.
	Resolve func(ctx context.Context, id string) (netip.Addr, error)
	// DialTimeout bounds connecting to the guest (default 5s).
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// strippedHeaders never reach the guest: they carry the caller's sandboxd
// credentials, which the code in a sandbox must not see.
var strippedHeaders = []string{"Authorization", "Proxy-Authorization", "X-Api-Key"}

// NewProxy returns an http.Handler that forwards
// Prefix{id}/proxy/{port}/{rest} to http://{guest address}:{port}/{rest},
// query included, websockets and other upgrades passed through. It does no
// authentication: mount it behind the API's. The guest sees the request
// with X-Forwarded-For/-Host/-Proto set and X-Forwarded-Prefix naming the
// path it is served under.
func NewProxy(opts ProxyOptions) *Proxy {
	if opts.Prefix == "" {
		opts.Prefix = "/api/sandboxes/"
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dialer := &net.Dialer{Timeout: opts.DialTimeout}
	transport := &http.Transport{
		Proxy:                 nil, // never an environment proxy: the guest is on a host link
		DialContext:           dialer.DialContext,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and SSE are fine
	}
	return &Proxy{opts: opts, transport: transport}
}

// Proxy is the port proxy; see NewProxy.
type Proxy struct {
	opts      ProxyOptions
	transport *http.Transport
}

// parsePath splits Prefix{id}/proxy/{port}/{rest}.
func (p *Proxy) parsePath(path string) (id string, port int, rest string, err error) {
	s, ok := strings.CutPrefix(path, p.opts.Prefix)
	if !ok {
		return "", 0, "", errors.New("not a proxy path")
	}
	id, s, ok = strings.Cut(s, "/proxy/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", 0, "", errors.New("not a proxy path")
	}
	portStr, rest, _ := strings.Cut(s, "/")
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, "", fmt.Errorf("bad port %q", portStr)
	}
	return id, port, "/" + rest, nil
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, rest, err := p.parsePath(r.URL.EscapedPath())
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	addr, err := p.opts.Resolve(r.Context(), id)
	if err != nil || !addr.IsValid() {
		http.Error(w, "sandbox not found or has no network", http.StatusNotFound)
		return
	}
	path, err := url.PathUnescape(rest)
	if err != nil {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	p.serve(w, r, id, port, addr, path, rest, p.opts.Prefix+id+"/proxy/"+strconv.Itoa(port), nil)
}

// ServePort forwards r as it is (path and Host included) to port of
// sandbox id, for a front end that routes by host name rather than by
// path (package e2b). Like ServeHTTP it does no authentication. closed,
// when set, answers instead of the proxy's own 502 when nothing answers
// on the port (the front end's own words for it).
func (p *Proxy) ServePort(w http.ResponseWriter, r *http.Request, id string, port int, closed func(http.ResponseWriter)) {
	if port < 1 || port > 65535 {
		http.Error(w, fmt.Sprintf("bad port %d", port), http.StatusNotFound)
		return
	}
	addr, err := p.opts.Resolve(r.Context(), id)
	if err != nil || !addr.IsValid() {
		http.Error(w, "sandbox not found or has no network", http.StatusNotFound)
		return
	}
	p.serve(w, r, id, port, addr, r.URL.Path, r.URL.EscapedPath(), "", closed)
}

// serve forwards r to port of the sandbox at addr, at path (rawPath
// escaped); prefix, when set, is the path it is served under; closed,
// when set, answers when nothing answers on the port.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, id string, port int, addr netip.Addr, path, rawPath, prefix string, closed func(http.ResponseWriter)) {
	target := netip.AddrPortFrom(addr, uint16(port)).String()
	keepHost := prefix == ""
	rp := &httputil.ReverseProxy{
		Transport: p.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = rawPath
			if !keepHost {
				pr.Out.Host = target
			}
			for _, h := range strippedHeaders {
				pr.Out.Header.Del(h)
			}
			pr.SetXForwarded()
			if prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.opts.Logger.Debug("sandbox port proxy", "sandbox", id, "port", port, "err", err)
			if closed != nil {
				closed(w)
				return
			}
			http.Error(w, fmt.Sprintf("nothing answers on port %d of the sandbox", port), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// Close releases the proxy's idle connections.
func (p *Proxy) Close() error {
	p.transport.CloseIdleConnections()
	return nil
}
