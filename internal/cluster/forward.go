package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Forwarder sends requests to other nodes' cluster listeners.
type Forwarder struct {
	secret Secret
	self   string
	scheme string // https with mutual TLS, else http
	proxy  *httputil.ReverseProxy
	// transport carries both Forward's requests and Do's, so that they
	// share the connections to each node.
	transport *http.Transport
	log       *slog.Logger
	now       func() time.Time
}

// NewForwarder returns the forwarder of node self. With tlsConf (mutual
// TLS), it forwards over https only, presenting the node's certificate
// and taking a peer's only when it chains to the cluster's CA and names
// the host of the peer's address; a peer that does not speak TLS is a
// failed forward, never plaintext instead.
func NewForwarder(secret Secret, self string, tlsConf *TLS, log *slog.Logger) *Forwarder {
	f := &Forwarder{secret: secret, self: self, scheme: "http", log: log, now: time.Now}
	f.transport = &http.Transport{
		Proxy:               nil, // node to node, never through an HTTP proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	if tlsConf != nil {
		f.scheme = "https"
		f.transport.TLSClientConfig = tlsConf.clientConfig()
		f.transport.TLSHandshakeTimeout = 5 * time.Second
	}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:       func(*httputil.ProxyRequest) {}, // each Forward sets its own (see Forward)
		FlushInterval: -1,                              // server-sent events and streams as they come
		ErrorHandler:  f.unreachable,
		ModifyResponse: func(resp *http.Response) error {
			if err := f.plaintextRefused(resp); err != nil {
				return err
			}
			return restoreKeyProtocol(resp)
		},
		Transport: f.transport,
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
	// The answer may start streaming back before the transport has read
	// the caller's body to its end (it reads once more past the last byte
	// to see the end). Without full duplex, the server would take the body
	// over as the answer's headers go out (reading the rest to discard it,
	// closing it), and that last read would fail and cut the forward's
	// connection mid-answer. ErrNotSupported (a writer that is not the
	// server's) leaves it as it was.
	_ = http.NewResponseController(w).EnableFullDuplex()
	p := *f.proxy
	p.Rewrite = func(pr *httputil.ProxyRequest) {
		pr.SetURL(&url.URL{Scheme: f.scheme, Host: node.Address})
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
	out.URL.Scheme, out.URL.Host = f.scheme, node.Address
	out.RequestURI = ""
	f.sign(out, node, Forward{From: f.self, KeyID: keyID, Placed: placed})
	// RoundTrip, not a client: an answer is the node's, never a redirect
	// to follow with the signature of another request.
	resp, err := f.transport.RoundTrip(out)
	if err == nil {
		if err = f.plaintextRefused(resp); err != nil {
			resp.Body.Close()
		}
	}
	if err != nil {
		attrs := []any{"node_id", node.ID, "address", node.Address, "err", err}
		if hint := tlsHint(err); hint != "" {
			attrs = append(attrs, "hint", hint)
		}
		f.log.WarnContext(req.Context(), "request to node failed", attrs...)
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
