package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// errPlaintextToTLS: this node forwarded in plain HTTP to a cluster
// listener that serves TLS.
var errPlaintextToTLS = errors.New("the node's cluster listener serves TLS and this node forwards in plain HTTP: give every node the same --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca settings (all with them, or none)")

// plaintextRefused recognises the answer Go's HTTP server gives a plain
// HTTP request on a TLS listener (an HTTP/1.0 400 saying so) and makes it
// a failed forward: passed on, it would tell the caller that their
// request was bad, and no node would log the misconfiguration.
// With TLS of its own, this node never sends plain HTTP: nothing to
// recognise.
func (f *Forwarder) plaintextRefused(resp *http.Response) error {
	if f.scheme != "http" || resp.StatusCode != http.StatusBadRequest || resp.ProtoMinor != 0 || resp.ProtoMajor != 1 {
		return nil
	}
	head := make([]byte, 128)
	n, _ := io.ReadFull(resp.Body, head)
	head = head[:n]
	if bytes.Contains(head, []byte("HTTP request to an HTTPS server")) {
		return errPlaintextToTLS
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return nil
}

// tlsHint says, for a forward that failed in the TLS handshake, what is
// likely wrong, for the operator reading the log ("" for other errors).
func tlsHint(err error) string {
	var rec tls.RecordHeaderError
	var host x509.HostnameError
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rec):
		return "the node's cluster listener does not speak TLS: it runs without --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca, which every node needs once one has them"
	case errors.As(err, &host):
		return "the node's certificate does not name the host of its address: make it with sandboxd admin cluster-cert node --address HOST, HOST the host of its --node-address"
	case errors.As(err, &unknown), errors.As(err, &verify):
		return "the node's certificate does not verify against this node's --cluster-tls-ca (another cluster's CA, or expired)"
	case strings.Contains(err.Error(), "remote error: tls:"):
		return "the node refused this node's certificate in the TLS handshake (not signed by its --cluster-tls-ca, or expired)"
	}
	return ""
}

// unreachable answers a forward that failed: the sandbox's node did not
// answer (it may be on its way to being declared down), or, with TLS, it
// could not be authenticated.
func (f *Forwarder) unreachable(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(ctxTarget).(target)
	attrs := []any{"node_id", t.node.ID, "address", t.node.Address, "err", err}
	if hint := tlsHint(err); hint != "" {
		attrs = append(attrs, "hint", hint)
	}
	f.log.WarnContext(r.Context(), "forward to node failed", attrs...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_ = json.NewEncoder(w).Encode(map[string]string{
		"status": "error",
		"error":  fmt.Sprintf("the node hosting this (%s) did not answer; try again shortly", t.node.ID),
	})
}
