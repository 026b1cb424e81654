package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// keyProtocolPrefix is the API's websocket subprotocol that carries a key
// (see package api): the key must not travel to the other node.
const keyProtocolPrefix = "sandboxd.key."

// Forwarder sends requests to other nodes' cluster listeners.
type Forwarder struct {
	secret Secret
	self   string
	proxy  *httputil.ReverseProxy
	// transport carries both Forward's requests and Do's, so that they
	// share the connections to each node.
	transport *http.Transport
	log       *slog.Logger
	now       func() time.Time
}

// NewForwarder returns the forwarder of node self.
func NewForwarder(secret Secret, self string, log *slog.Logger) *Forwarder {
	f := &Forwarder{secret: secret, self: self, log: log, now: time.Now}
	f.transport = &http.Transport{
		Proxy:               nil, // node to node, never through an HTTP proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:        func(*httputil.ProxyRequest) {}, // each Forward sets its own (see Forward)
		FlushInterval:  -1,                              // server-sent events and streams as they come
		ErrorHandler:   f.unreachable,
		ModifyResponse: restoreKeyProtocol,
		Transport:      f.transport,
	}
	return f
}

type ctxKey int

const (
	ctxTarget ctxKey = iota
	ctxKeyProtocol
)

// target is where one forward goes and as whom.
type target struct {
	node store.Node
	fw   Forward
}

// Forward serves r by sending it to node, signed as coming from this node
// for the caller's key keyID (placed: a create this node placed there).
// The caller's own credentials (x-api-key, Authorization, a key
// subprotocol) are removed: the other node authenticates the signature and
// looks the key up by its id. Streams, server-sent events and websockets
// pass through.
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, node store.Node, keyID string, placed bool) {
	t := target{node: node, fw: Forward{From: f.self, KeyID: keyID, Placed: placed}}
	ctx := context.WithValue(r.Context(), ctxTarget, t)
	if proto := stripKeyProtocol(r.Header.Clone()); proto != "" {
		ctx = context.WithValue(ctx, ctxKeyProtocol, proto)
	}
	p := *f.proxy
	p.Rewrite = func(pr *httputil.ProxyRequest) {
		pr.SetURL(&url.URL{Scheme: "http", Host: node.Address})
		f.sign(pr.Out, node, t.fw)
	}
	p.ServeHTTP(w, r.WithContext(ctx))
}

// Do sends req to node as Forward sends a request (signed for the caller's
// key keyID, without the caller's own credentials; placed: a create this
// node placed there) and returns the node's response, for this node's
// own front ends (the MCP tools) that read the answer instead of passing
// it on. req's URL is a path on the API (its host is ignored); the caller
// closes the response's body. An error means the node did not answer.
func (f *Forwarder) Do(req *http.Request, node store.Node, keyID string, placed bool) (*http.Response, error) {
	if node.Address == "" {
		return nil, fmt.Errorf("node %s has no cluster address", node.ID)
	}
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host = "http", node.Address
	out.RequestURI = ""
	f.sign(out, node, Forward{From: f.self, KeyID: keyID, Placed: placed})
	// RoundTrip, not a client: an answer is the node's, never a redirect
	// to follow with the signature of another request.
	resp, err := f.transport.RoundTrip(out)
	if err != nil {
		f.log.WarnContext(req.Context(), "request to node failed", "node_id", node.ID, "address", node.Address, "err", err)
		return nil, fmt.Errorf("node %s (%s): %w", node.ID, node.Address, err)
	}
	return resp, nil
}

// sign readies out, a request to node, as a forward: the caller's own
// credentials removed (the other node authenticates the signature and
// looks the key up by its id), signed as fw.
func (f *Forwarder) sign(out *http.Request, node store.Node, fw Forward) {
	out.Host = node.Address
	out.Header.Del("x-api-key")
	out.Header.Del("Authorization")
	stripKeyProtocol(out.Header)
	f.secret.Sign(out, fw, f.now())
}

// stripKeyProtocol removes the key subprotocol from a websocket upgrade's
// offers and returns it.
func stripKeyProtocol(h http.Header) string {
	var keep []string
	var key string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if strings.HasPrefix(p, keyProtocolPrefix) {
				key = p
				continue
			}
			if p != "" {
				keep = append(keep, p)
			}
		}
	}
	if key == "" {
		return ""
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
	return key
}

// restoreKeyProtocol answers a websocket upgrade whose key subprotocol was
// stripped with that subprotocol, as this node would have: the client
// only accepts a subprotocol it offered, and it offered that one.
func restoreKeyProtocol(resp *http.Response) error {
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Request == nil {
		return nil
	}
	if proto, ok := resp.Request.Context().Value(ctxKeyProtocol).(string); ok && resp.Header.Get("Sec-WebSocket-Protocol") == "" {
		resp.Header.Set("Sec-WebSocket-Protocol", proto)
	}
	return nil
}

// unreachable answers a forward that failed: the sandbox's node did not
// answer (it may be on its way to being declared down).
func (f *Forwarder) unreachable(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(ctxTarget).(target)
	f.log.WarnContext(r.Context(), "forward to node failed", "node_id", t.node.ID, "address", t.node.Address, "err", err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_ = json.NewEncoder(w).Encode(map[string]string{
		"status": "error",
		"error":  fmt.Sprintf("the node hosting this (%s) did not answer; try again shortly", t.node.ID),
	})
}
