package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterTLSFlags: the three --cluster-tls-* flags go together, with
// a cluster listener, and serve says which are missing before it does
// anything else; the SANDBOXD_ variables count as the flags.
func TestClusterTLSFlags(t *testing.T) {
	for _, tc := range []struct {
		name          string
		opts          clusterOptions
		want, without string // in the error; "" for none
	}{
		{"none", clusterOptions{}, "", ""},
		{"none, in a cluster", clusterOptions{listen: "127.0.0.1:8081"}, "", ""},
		{"cert only", clusterOptions{listen: "127.0.0.1:8081", tlsCert: "c"}, "--cluster-tls-cert given without --cluster-tls-key, --cluster-tls-ca", ""},
		{"cert and key", clusterOptions{listen: "127.0.0.1:8081", tlsCert: "c", tlsKey: "k"}, "without --cluster-tls-ca", "without --cluster-tls-key"},
		{"CA only", clusterOptions{listen: "127.0.0.1:8081", tlsCA: "a"}, "--cluster-tls-ca given without --cluster-tls-cert, --cluster-tls-key", ""},
		{"no listener", clusterOptions{tlsCert: "c", tlsKey: "k", tlsCA: "a"}, "give --cluster-listen too", ""},
		{"all three", clusterOptions{listen: "127.0.0.1:8081", tlsCert: "c", tlsKey: "k", tlsCA: "a"}, "", ""},
	} {
		err := tc.opts.checkTLS()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.want)
		case tc.without != "" && strings.Contains(err.Error(), tc.without):
			t.Errorf("%s: %v names a flag that was given", tc.name, err)
		}
	}

	// Through the command, one flag on the command line and one in the
	// environment: refused before the data dir is touched.
	dataDir := filepath.Join(t.TempDir(), "data")
	t.Setenv("SANDBOXD_CLUSTER_TLS_KEY", "/etc/sandboxd/node.key")
	root := newRootCmd()
	root.SetArgs([]string{"serve", "--data-dir", dataDir, "--cluster-listen", "127.0.0.1:0", "--cluster-tls-cert", "/etc/sandboxd/node.crt"})
	root.SetOut(&bytes.Buffer{})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--cluster-tls-cert, --cluster-tls-key given without --cluster-tls-ca") {
		t.Fatalf("serve with two of three: %v", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the data dir was made before the flags were checked: %v", err)
	}
}
