package cluster

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

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
