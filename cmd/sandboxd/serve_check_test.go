package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/store"
)

// parseServe runs `sandboxd serve args`, with env as the environment, as
// far as serve goes before it opens or starts anything: the flags, the
// environment rule and every group's check. It returns the options serve
// would be given, or the error it stops with.
func parseServe(t *testing.T, env map[string]string, args ...string) (*serveOptions, error) {
	t.Helper()
	g, o := &globals{}, &serveOptions{}
	started := false
	root := &cobra.Command{
		Use: "sandboxd", SilenceUsage: true, SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags(), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		},
	}
	g.register(root)
	root.AddCommand(serveCommand(g, o, func(context.Context, *globals, *serveOptions) error {
		started = true
		return nil
	}))
	root.SetArgs(append([]string{"serve"}, args...))
	err := root.Execute()
	if err == nil && !started {
		t.Fatalf("serve %v: no error, and serve was not reached", args)
	}
	return o, err
}

// TestServeRefusesBadValues: a value serve cannot use stops it before it
// starts anything, with an error naming the flag and, when the value came
// from the environment, the variable.
func TestServeRefusesBadValues(t *testing.T) {
	dir := t.TempDir()
	shortKey := filepath.Join(dir, "admin.key")
	secret := filepath.Join(dir, "cluster.secret")
	if err := os.WriteFile(shortKey, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := []string{"--blob-store", "s3://a:b@s3.test:9000/bucket", "--cluster-secret-file", secret}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"negative max paused", []string{"--max-paused=-1s"}, nil, []string{"--max-paused -1s: want 0 (unlimited) or more"}},
		{"max paused from env", nil, map[string]string{"SANDBOXD_MAX_PAUSED": "-1h"}, []string{"--max-paused -1h0m0s", "--max-paused is set by SANDBOXD_MAX_PAUSED"}},
		{"log cap", []string{"--log-max-mib", "0"}, nil, []string{"--log-max-mib 0: want 1 to 1048576"}},
		{"log cap from env", nil, map[string]string{"SANDBOXD_LOG_MAX_MIB": "2000000"}, []string{"--log-max-mib 2000000", "set by SANDBOXD_LOG_MAX_MIB"}},
		{"runtime", []string{"--runtime", "firecracker"}, nil, []string{`--runtime "firecracker": unknown runtime`}},
		{"gvisor platform", []string{"--gvisor-platform", "fast"}, nil, []string{`--gvisor-platform "fast"`}},
		{"template", []string{"--template", "huge"}, nil, []string{`--template "huge": unknown template`}},
		{"rootfs", []string{"--rootfs", filepath.Join(dir, "none")}, nil, []string{"--rootfs", "is not a directory"}},
		{"network prefix", []string{"--network-prefix", "Sbx"}, nil, []string{`--network-prefix "Sbx"`}},
		{"network pool", []string{"--network-pool", "10.0.0.0/31"}, nil, []string{"--network-pool 10.0.0.0/31"}},
		{"listen", []string{"--listen", "8080"}, nil, []string{`--listen "8080": want host:port`}},
		{"metrics from env", nil, map[string]string{"SANDBOXD_METRICS_ADDR": "localhost"}, []string{`--metrics-addr "localhost"`, "set by SANDBOXD_METRICS_ADDR"}},
		{"public URL", []string{"--public-url", "sandboxd.example"}, nil, []string{`--public-url "sandboxd.example"`}},
		{"model URL", []string{"--anthropic-base-url", "api.anthropic.com"}, nil, []string{`--anthropic-base-url "api.anthropic.com"`}},
		{"jobs", []string{"--job-concurrency", "0"}, nil, []string{"--job-concurrency 0: want 1 or more"}},
		{"budget", []string{"--model-daily-requests-per-account", "-1"}, nil, []string{"--model-daily-requests-per-account -1"}},
		{"retention", []string{"--keep-finished-runs", "-1h"}, nil, []string{"--keep-finished-runs -1h0m0s"}},
		{"memory", []string{"--sandbox-memory-mib", "0"}, nil, []string{"--sandbox-memory-mib 0: want 1 or more"}},
		{"log level", []string{"--log-level", "loud"}, nil, []string{`--log-level "loud"`}},
		{"admin key from env", nil, map[string]string{"SANDBOXD_ADMIN_KEY_FILE": shortKey}, []string{"want at least 32", "--admin-key-file is set by SANDBOXD_ADMIN_KEY_FILE"}},
		{"cluster without secret", []string{"--cluster-listen", "127.0.0.1:0"}, nil, []string{"--cluster-listen needs --cluster-secret-file"}},
		{"cluster on every address", append([]string{"--cluster-listen", "0.0.0.0:7000"}, cluster...), nil, []string{"listens on every address: give --node-address"}},
		{"cluster heartbeat", append([]string{"--cluster-listen", "127.0.0.1:7000", "--node-down-after", "10ms"}, cluster...), nil, []string{"--node-down-after 10ms: at least 1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseServe(t, tc.env, tc.args...)
			for _, want := range tc.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%v %v: %v, want it to say %q", tc.env, tc.args, err, want)
				}
			}
		})
	}
}

// TestServeChecksDerive: what the checks derive is in the options serve
// gets: the public URL from --listen, --rootfs made absolute, the node's
// address from --cluster-listen and the cluster's secret read.
func TestServeChecksDerive(t *testing.T) {
	o, err := parseServe(t, nil)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if o.files.publicURL != "http://127.0.0.1:8080" {
		t.Errorf("public URL %q", o.files.publicURL)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("rootfs", 0o755); err != nil {
		t.Fatal(err)
	}
	secret := strings.Repeat("s", 40)
	if err := os.WriteFile("secret", []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parseServe(t, map[string]string{"SANDBOXD_CLUSTER_SECRET_FILE": "secret"},
		"--rootfs", "rootfs", "--listen", "10.0.0.1:80", "--cluster-listen", "10.0.0.1:8081", "--blob-store", "s3://a:b@s3.test/bucket")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "rootfs"); o.runtime.rootfs != want {
		t.Errorf("rootfs %q, want %q", o.runtime.rootfs, want)
	}
	if o.files.publicURL != "http://10.0.0.1:80" || o.cluster.address != "10.0.0.1:8081" || string(o.cluster.secret) != secret {
		t.Errorf("public URL %q, node address %q, secret %q", o.files.publicURL, o.cluster.address, o.cluster.secret)
	}
}

// TestSetupStorageAlone: the storage component is set up from its options
// and the data dir alone (SQLite there, blobs under it), and a bad
// --blob-store is refused naming the flag.
func TestSetupStorageAlone(t *testing.T) {
	dir := t.TempDir()
	g := &globals{dataDir: dir, logLevel: "error"}
	log := slog.New(slog.DiscardHandler)
	stor, closeStorage, err := setupStorage(context.Background(), g, storageOptions{blobCacheMiB: 16}, dir, "node-1", log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStorage()
	if _, local := stor.blobs.(*blob.Local); !local || stor.cache != nil || stor.cacheBytes() != 0 {
		t.Errorf("blobs %T, cache %v: want the local store, uncached", stor.blobs, stor.cache)
	}
	if stor.st.Dialect() != store.DialectSQLite || stor.homeSocket() != filepath.Join(dir, "sandboxd.sock") {
		t.Errorf("database %s, home socket %s", stor.st.Dialect(), stor.homeSocket())
	}
	_, _, err = setupStorage(context.Background(), g, storageOptions{blobURL: "ftp://blobs.test/x"}, dir, "node-1", log)
	if err == nil || !strings.HasPrefix(err.Error(), "--blob-store: ") {
		t.Errorf("ftp blob store: %v, want an error naming --blob-store", err)
	}
}

// TestSetupForgeAlone: GitHub is configured only with a token and an
// owner, and a bad owner is refused naming the flag.
func TestSetupForgeAlone(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if p, err := setupForge(forgeOptions{owner: "acme"}, log); err != nil || p.gh != nil || p.mirror != nil {
		t.Errorf("owner without token: %+v %v, want nothing configured", p, err)
	}
	_, err := setupForge(forgeOptions{token: "t", owner: "not an owner"}, log)
	if err == nil || !strings.Contains(err.Error(), "configure GitHub") || !strings.Contains(err.Error(), `"not an owner"`) {
		t.Errorf("bad owner: %v", err)
	}
}
