package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// TLS is a node's mutual TLS between nodes: its own certificate, which
// serves its cluster listener and authenticates its forwards, and the
// cluster's CA, which every peer's certificate must chain to. The
// signature stays required on top (it names the caller's key, and a
// stolen node certificate alone does not make forwards).
type TLS struct {
	cert  tls.Certificate
	roots *x509.CertPool
}

// LoadTLS reads the node's certificate and key and the CA's certificate
// (one or more: while a cluster changes its CA, both are trusted) from PEM
// files, and checks that the node's certificate is one the other nodes
// will take: signed by that CA, valid at now, for server and client use.
func LoadTLS(certFile, keyFile, caFile string, now time.Time) (*TLS, error) {
	var pems [3][]byte
	for i, f := range []string{certFile, keyFile, caFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("cluster TLS: %w", err)
		}
		pems[i] = b
	}
	t, err := newTLS(pems[0], pems[1], pems[2], now)
	if err != nil {
		return nil, fmt.Errorf("cluster TLS (--cluster-tls-cert %s, --cluster-tls-key %s, --cluster-tls-ca %s): %w", certFile, keyFile, caFile, err)
	}
	return t, nil
}

func newTLS(certPEM, keyPEM, caPEM []byte, now time.Time) (*TLS, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate and key: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no PEM certificate in the CA file")
	}
	t := &TLS{cert: cert, roots: roots}
	if err := t.verifyOwn(now); err != nil {
		return nil, err
	}
	return t, nil
}

// verifyOwn checks the node's certificate as a peer would, in both roles.
func (t *TLS) verifyOwn(now time.Time) error {
	leaf := t.cert.Leaf
	if leaf == nil {
		return errors.New("no certificate")
	}
	inter := x509.NewCertPool()
	for _, der := range t.cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return fmt.Errorf("the node's certificate does not verify against the CA (the other nodes would refuse it): %w", err)
		}
	}
	return nil
}

// CheckAddress says whether the node's certificate names the host of its
// advertised address (host:port), which the other nodes check it against
// when they forward to it.
func (t *TLS) CheckAddress(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("node address %q: %w", address, err)
	}
	if err := t.cert.Leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("the cluster TLS certificate does not name %s, the host other nodes reach this node at (make one with sandboxd admin cluster-cert node --address %s): %w", host, host, err)
	}
	return nil
}

// NotAfter is when the node's certificate expires.
func (t *TLS) NotAfter() time.Time { return t.cert.Leaf.NotAfter }

// Listener wraps the cluster listener's ln in TLS: TLS 1.3 only, and a
// client certificate signed by the cluster's CA required in the
// handshake, so nothing without one reaches the HTTP server.
func (t *TLS) Listener(ln net.Listener) net.Listener {
	return tls.NewListener(ln, t.serverConfig())
}

func (t *TLS) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    t.roots,
		// HTTP/1.1 only: forwarded websockets are HTTP/1.1 upgrades, which
		// HTTP/2 does not carry.
		NextProtos: []string{"http/1.1"},
	}
}

// clientConfig is the forwarder's side. ServerName is left to the
// transport, which sets it to the host of the URL it dials: the host of
// the peer's advertised address, which its certificate must name.
func (t *TLS) clientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.roots,
		NextProtos:   []string{"http/1.1"},
	}
}
