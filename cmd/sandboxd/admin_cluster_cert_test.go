package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runAdmin runs `sandboxd args...` and decodes its --json output.
func runAdmin(t *testing.T, out any, args ...string) error {
	t.Helper()
	root := newRootCmd()
	var stdout bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&bytes.Buffer{})
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stdout.String())
		}
	}
	return nil
}

// TestClusterCertCommands: `admin cluster-cert ca` and `node` write what
// serve's --cluster-tls-* flags load, keys readable by their owner only,
// and never replace a file; serve refuses a certificate that does not
// name the host of its --node-address.
func TestClusterCertCommands(t *testing.T) {
	dir := t.TempDir()
	caDir, nodeDir := filepath.Join(dir, "ca"), filepath.Join(dir, "n1")
	var ca, node certInfo
	if err := runAdmin(t, &ca, "admin", "cluster-cert", "ca", "--out", caDir, "--json"); err != nil {
		t.Fatal(err)
	}
	if err := runAdmin(t, &node, "admin", "cluster-cert", "node", "--ca", caDir, "--name", "n1",
		"--address", "127.0.0.1:8081,node1.internal", "--out", nodeDir, "--json"); err != nil {
		t.Fatal(err)
	}
	if ca.Cert != filepath.Join(caDir, "ca.crt") || node.Cert != filepath.Join(nodeDir, "node.crt") || node.CA != filepath.Join(nodeDir, "ca.crt") {
		t.Errorf("paths: %+v %+v", ca, node)
	}
	if strings.Join(node.Addresses, ",") != "127.0.0.1,node1.internal" || len(node.SHA256) != 64 {
		t.Errorf("node: %+v", node)
	}
	if d := time.Until(node.NotAfter); d < 700*24*time.Hour || d > 731*24*time.Hour {
		t.Errorf("node certificate valid for %v", d)
	}
	for path, want := range map[string]os.FileMode{ca.Key: 0o600, node.Key: 0o600, node.Cert: 0o644, nodeDir: 0o700 | os.ModeDir} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want %v", path, fi.Mode(), err, want)
		}
	}

	opts := clusterOptions{listen: "127.0.0.1:8081", address: "127.0.0.1:8081", tlsCert: node.Cert, tlsKey: node.Key, tlsCA: node.CA}
	if conf, err := opts.loadTLS(time.Now()); err != nil || conf == nil {
		t.Fatalf("load: %v", err)
	}
	opts.address = "127.0.0.2:8081"
	if _, err := opts.loadTLS(time.Now()); err == nil || !strings.Contains(err.Error(), "does not name 127.0.0.2") {
		t.Errorf("a certificate for another address: %v", err)
	}
	opts.address, opts.tlsCA = "node1.internal:8081", ca.Cert
	if _, err := opts.loadTLS(time.Now()); err != nil {
		t.Errorf("by DNS name, with the CA's own ca.crt: %v", err)
	}

	// Nothing is replaced; a failed node leaves no files behind.
	if err := runAdmin(t, nil, "admin", "cluster-cert", "ca", "--out", caDir); err == nil || !strings.Contains(err.Error(), "exists: not replaced") {
		t.Errorf("a second CA over the first: %v", err)
	}
	if err := runAdmin(t, nil, "admin", "cluster-cert", "node", "--ca", caDir, "--name", "n1", "--address", "127.0.0.1", "--out", nodeDir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a node certificate over another: %v", err)
	}
	other := filepath.Join(dir, "n2")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "ca.crt"), []byte("another CA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runAdmin(t, nil, "admin", "cluster-cert", "node", "--ca", caDir, "--name", "n2", "--address", "127.0.0.1", "--out", other); err == nil {
		t.Error("a ca.crt of another CA was replaced")
	}
	if _, err := os.Stat(filepath.Join(other, "node.key")); !os.IsNotExist(err) {
		t.Errorf("a failed node left its key: %v", err)
	}
	if err := runAdmin(t, nil, "admin", "cluster-cert", "node", "--ca", nodeDir, "--name", "n3", "--address", "127.0.0.1", "--out", filepath.Join(dir, "n3")); err == nil || !strings.Contains(err.Error(), "ca.key") {
		t.Errorf("a --ca without the CA's key: %v", err)
	}
	// Into the CA's own directory: its ca.crt is the same and stays.
	if err := runAdmin(t, nil, "admin", "cluster-cert", "node", "--ca", caDir, "--name", "n4", "--address", "127.0.0.1", "--out", caDir); err != nil {
		t.Errorf("a node certificate beside the CA: %v", err)
	}
}
