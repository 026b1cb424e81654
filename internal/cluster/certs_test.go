package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCerts: what `sandboxd admin cluster-cert` makes verifies as the
// cluster listener needs, and what it should not take is refused early.
func TestCerts(t *testing.T) {
	now := time.Now()
	ca, caIss, err := NewCA("c", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !caIss.Cert.IsCA || caIss.Cert.MaxPathLen != 0 || !caIss.Cert.MaxPathLenZero {
		t.Errorf("CA constraints: %+v", caIss.Cert.BasicConstraintsValid)
	}
	node, err := ca.IssueNode("n1", []string{"192.0.2.11:8081", "node1.internal", "[2001:db8::1]:8081"}, now, DefaultNodeValidity)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(node.Cert.IPAddresses) != "[192.0.2.11 2001:db8::1]" || fmt.Sprint(node.Cert.DNSNames) != "[node1.internal]" {
		t.Errorf("SANs %v %v", node.Cert.IPAddresses, node.Cert.DNSNames)
	}
	if !node.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("a node certificate outlives its CA: %v > %v", node.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if !strings.Contains(string(node.KeyPEM), "BEGIN PRIVATE KEY") {
		t.Errorf("key is not PKCS#8 PEM")
	}

	// Files, as serve loads them.
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	certF, keyF, caF := write("node.crt", node.CertPEM), write("node.key", node.KeyPEM), write("ca.crt", caIss.CertPEM)
	conf, err := LoadTLS(certF, keyF, caF, now)
	if err != nil {
		t.Fatal(err)
	}
	for addr, ok := range map[string]bool{"192.0.2.11:8081": true, "node1.internal:8081": true, "[2001:db8::1]:8081": true, "192.0.2.12:8081": false, "node2.internal:8081": false} {
		if err := conf.CheckAddress(addr); (err == nil) != ok {
			t.Errorf("CheckAddress(%s): %v", addr, err)
		}
	}
	if _, err := LoadTLS(certF, keyF, caF, now.Add(48*time.Hour)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired certificate: %v", err)
	}
	_, otherIss, _ := NewCA("other", now, time.Hour)
	if _, err := LoadTLS(certF, keyF, write("other.crt", otherIss.CertPEM), now); err == nil || !strings.Contains(err.Error(), "does not verify against the CA") {
		t.Errorf("a certificate of another CA: %v", err)
	}
	if _, err := LoadTLS(certF, write("wrong.key", caIss.KeyPEM), caF, now); err == nil {
		t.Error("a key that is not the certificate's was accepted")
	}

	// The CA read back from its files signs as it did.
	back, err := ParseCA(caIss.CertPEM, caIss.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := back.IssueNode("n2", []string{"127.0.0.1"}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseCA(caIss.CertPEM, node.KeyPEM); err == nil {
		t.Error("a CA with another key was accepted")
	}
	if _, err := ParseCA(node.CertPEM, node.KeyPEM); err == nil {
		t.Error("a node certificate was accepted as a CA")
	}
	for in, want := range map[string]string{"10.0.0.1": "10.0.0.1", "10.0.0.1:8081": "10.0.0.1", "[::1]:1": "::1", "::1": "::1", "a-b.example": "a-b.example"} {
		if got, err := SANHost(in); got != want || err != nil {
			t.Errorf("SANHost(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", ":8081", "bad host", "-x.example", "a..b", "under_score"} {
		if _, err := SANHost(bad); err == nil {
			t.Errorf("SANHost(%q) accepted", bad)
		}
	}
	if _, err := ca.IssueNode("n", nil, now, time.Hour); err == nil {
		t.Error("a node certificate without an address")
	}
}
