package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"
)

// Certificates for mutual TLS between nodes, made by `sandboxd admin
// cluster-cert` so that an operator needs no openssl recipes. One CA per
// cluster signs one certificate per node; each node's certificate serves
// its cluster listener and authenticates its forwards, so it is for both
// server and client use. Keys are ECDSA P-256: every TLS stack and tool
// (openssl, curl) an operator may inspect them with takes them.

// Default validities: a CA long enough not to be a chore, a node's
// certificate short enough that a lost key does not stay good for ever.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 2 * 365 * 24 * time.Hour
)

// backdate is how far before its making a certificate is valid from: the
// host that makes it and the nodes that check it do not share a clock.
const backdate = time.Hour

// CA is a cluster's certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Issued is a certificate with its key, PEM-encoded for files.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte // PKCS#8
}

// NewCA makes a self-signed CA called name, valid for validity from now.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, Issued, error) {
	if name == "" {
		return nil, Issued{}, errors.New("a CA needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, Issued{}, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, Issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"sandboxd cluster"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// It signs node certificates only, never another CA.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	iss, err := issue(tmpl, tmpl, key, key)
	if err != nil {
		return nil, Issued{}, fmt.Errorf("make CA certificate: %w", err)
	}
	return &CA{Cert: iss.Cert, Key: key}, iss, nil
}

// ParseCA reads a CA from its PEM certificate and PKCS#8 key (what NewCA
// wrote), checking that they belong together and can sign.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate: not a CA (no CA basic constraint or no certificate-signing usage)")
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("CA key: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key: a %T cannot sign", k)
	}
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// IssueNode makes the certificate of node name for the hosts other nodes
// reach it at (IP addresses or DNS names: the host of its advertised
// address, --node-address, must be one of them), valid for validity from
// now but never beyond the CA.
func (ca *CA) IssueNode(name string, hosts []string, now time.Time, validity time.Duration) (Issued, error) {
	if name == "" {
		return Issued{}, errors.New("a node certificate needs a name")
	}
	if len(hosts) == 0 {
		return Issued{}, errors.New("a node certificate needs at least one address")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, fmt.Errorf("generate node key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return Issued{}, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"sandboxd cluster"}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// A node serves its cluster listener and forwards to the others'.
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		h, err := SANHost(h)
		if err != nil {
			return Issued{}, err
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	iss, err := issue(tmpl, ca.Cert, key, ca.Key)
	if err != nil {
		return Issued{}, fmt.Errorf("make certificate of node %s: %w", name, err)
	}
	return iss, nil
}

// SANHost is the host an --address names, for a certificate: a bare host
// or IP, or the host of a host:port (what --node-address is), brackets of
// an IPv6 address removed. A DNS name is checked for the characters a
// host name may have, so a typo fails here rather than at the first
// forward.
func SANHost(s string) (string, error) {
	h := strings.TrimSpace(s)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if h == "" {
		return "", fmt.Errorf("address %q: no host", s)
	}
	if net.ParseIP(h) != nil {
		return h, nil
	}
	for _, label := range strings.Split(h, ".") {
		ok := label != "" && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for _, c := range label {
			ok = ok && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-')
		}
		if !ok {
			return "", fmt.Errorf("address %q: not an IP address or a DNS name", s)
		}
	}
	return h, nil
}

// Fingerprint is the SHA-256 of a certificate's DER, in hex: what
// `openssl x509 -fingerprint -sha256` shows, without the colons.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

func issue(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) (Issued, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return Issued{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Issued{}, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
	}, nil
}

// randomSerial is a certificate serial of 128 random bits (RFC 5280 wants
// them unique per CA and unpredictable).
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return n, nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(block.Bytes)
}
