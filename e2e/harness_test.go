// Package e2e drives a real `sandboxd serve` over HTTP: it builds the binary,
// starts it on a free loopback port with a temporary data dir, creates
// accounts and keys with the admin CLI, and checks the API's answers.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// binary is the sandboxd binary built once for all tests.
var binary string

func TestMain(m *testing.M) {
	// The binary goes beside the tests (ignored by git) rather than into a
	// temp dir, because storetest.Main exits without running deferred code.
	abs, err := filepath.Abs(filepath.Join(".bin", "sandboxd"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = abs
	build := exec.Command("go", "build", "-o", binary, "../cmd/sandboxd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build sandboxd:", err)
		os.Exit(1)
	}
	// The gVisor runtime finds the agent next to the sandboxd binary.
	if err := busybox.BuildAgent(filepath.Join(filepath.Dir(binary), "sandbox-agent")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Sandboxes start from a small busybox root filesystem built here in
	// milliseconds (a test image; the real one is built with debootstrap).
	rootfs = filepath.Join(filepath.Dir(binary), "rootfs")
	_ = os.RemoveAll(rootfs)
	if err := busybox.BuildRootfs(rootfs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	storetest.Main(m)
}

// rootfs is the test root filesystem every test server uses.
var rootfs string

// defaultImage, among startServer's extra flags, starts the server on the
// image `sandboxd serve` picks by itself (what `make run` serves) instead of
// the test rootfs: an empty --rootfs is serve's own default, so the server
// resolves its default template as a fresh install would.
const defaultImage = "--rootfs="

// server is one running sandboxd.
type server struct {
	t *testing.T
	// netPrefix names the host's network objects this server makes: its
	// own, so that servers running at once (a cluster, tests of other
	// packages) never remove each other's as leftovers.
	netPrefix string
	base      string
	metrics   string // base URL of the metrics listener
	dataDir   string
	dsn       string
	cmd       *exec.Cmd
	logs      *bytes.Buffer
}

// startServer runs sandboxd serve on dsn with extra flags and waits until it
// answers /api/health.
func startServer(t *testing.T, dsn string, extra ...string) *server {
	t.Helper()
	return startServerIn(t, t.TempDir(), dsn, extra...)
}

// startServerIn is startServer on a given data dir.
func startServerIn(t *testing.T, dataDir, dsn string, extra ...string) *server {
	t.Helper()
	s := &server{t: t, dataDir: dataDir, dsn: dsn, logs: &bytes.Buffer{}, netPrefix: netPrefixFor(dataDir)}
	addrs := freeAddrs(t, 2)
	addr, metricsAddr := addrs[0], addrs[1]
	s.base = "http://" + addr
	s.metrics = "http://" + metricsAddr
	args := append([]string{"serve", "--listen", addr, "--metrics-addr", metricsAddr, "--warm-pool", "1", "--sandbox-disk-mib", "256", "--gvisor-platform", "ptrace", "--keep-sandboxes=false", "--setup-on-first-use=false"}, s.globalFlags()...)
	if !slices.Contains(extra, "--template") && !slices.Contains(extra, defaultImage) {
		args = append(args, "--rootfs", rootfs)
	}
	if !slices.Contains(extra, "--network-prefix") {
		args = append(args, "--network-prefix", s.netPrefix)
	}
	args = append(args, extra...)
	s.cmd = exec.Command(binary, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start sandboxd: %v", err)
	}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("sandboxd logs:\n%s", s.logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.base + "/api/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandboxd did not become healthy; logs:\n%s", s.logs.String())
	return nil
}

func (s *server) globalFlags() []string {
	return []string{"--data-dir", s.dataDir, "--database", s.dsn}
}

// stop asks the server to shut down gracefully and waits for it.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func freeAddr(t *testing.T) string { return freeAddrs(t, 1)[0] }

// freeAddrs are n distinct free loopback addresses: each is held until all
// are chosen, so that the kernel cannot hand the same port out twice (a
// server's API and metrics listeners once got one port).
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// admin runs an admin command against the server's database and decodes
// its --json output into out (when out is not nil).
func (s *server) admin(out any, args ...string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	full := append(append([]string{}, args...), s.globalFlags()...)
	cmd := exec.CommandContext(ctx, binary, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("sandboxd %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if out != nil {
		if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
			s.t.Fatalf("decode output of %s: %v\n%s", strings.Join(args, " "), err, stdout.String())
		}
	}
}

type account struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Slug string `json:"slug"`
}

type key struct {
	ID        string `json:"id"`
	Key       string `json:"key"`
	AccountID string `json:"account_id"`
}

func (s *server) createAccount(name string, org bool) account {
	var a account
	args := []string{"admin", "account", "create", "--name", name, "--json"}
	if org {
		args = append(args, "--org")
	}
	s.admin(&a, args...)
	return a
}

func (s *server) createKey(accountID string) key {
	var k key
	s.admin(&k, "admin", "key", "create", "--account", accountID, "--json")
	return k
}

// response is a decoded API answer.
type response struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    []byte
}

// call sends a request with the given headers ("x-api-key"/"Authorization")
// and a body (string as is, anything else as JSON, nil for none).
func (s *server) call(method, path string, headers map[string]string, body any) response {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := response{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out.Body); err != nil {
			s.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return out
}

// as is shorthand for calling with an x-api-key.
func (s *server) as(k key, method, path string, body any) response {
	s.t.Helper()
	return s.call(method, path, map[string]string{"x-api-key": k.Key}, body)
}

// forEachDatabase runs fn against a fresh SQLite file and a fresh
// PostgreSQL database.
func forEachDatabase(t *testing.T, fn func(t *testing.T, dsn string)) {
	storetest.Dialects(t, fn)
}

// netPrefixFor is the network prefix of the server on dataDir: the same
// after a restart, "e" and three letters from the directory's hash, so no
// two servers' prefixes (nor sandboxd's default "sbx", nor the netpol
// tests' "tn…") start one another. A server a test stopped with its
// sandboxes kept leaves its rules, which match interfaces by prefix: a
// netpol test's "tnb…" interfaces were dropped by a server's "tnbq".
func netPrefixFor(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	b := []byte{'e', 0, 0, 0}
	for i := 1; i < len(b); i++ {
		b[i] = 'a' + sum[i]%26
	}
	return string(b)
}
