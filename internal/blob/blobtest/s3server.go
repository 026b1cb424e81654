package blobtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// VersityGW is the S3-compatible server tests run against: versitygw serves
// a directory over the S3 protocol and builds with plain go install.
const VersityGW = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// EnvRequireS3 makes StartS3 fail instead of skip when it cannot provide a
// server; CI sets it so that the S3 backend is never silently untested.
const EnvRequireS3 = "SANDBOXD_REQUIRE_S3"

// The versitygw binary is looked up (or built) once per test process.
var (
	gwOnce sync.Once
	gwPath string
	gwErr  error
)

// StartS3 starts a versitygw server on a free loopback port, serving a fresh
// temporary directory, and returns the blob store URL of an S3 store on it
// (with credentials, a bucket that does not exist yet, and a prefix). The
// server stops when the test ends. Without versitygw on PATH or in
// $(go env GOPATH)/bin, StartS3 builds it with go install (about a minute,
// once: the binary stays in GOPATH/bin). When no server can be had, the
// test is skipped, or fails if SANDBOXD_REQUIRE_S3=1.
func StartS3(t testing.TB) string {
	t.Helper()
	url, err := startS3(t)
	if err != nil {
		if os.Getenv(EnvRequireS3) == "1" {
			t.Fatalf("S3 test server: %v", err)
		}
		t.Skipf("no S3 test server (set %s=1 to fail instead): %v", EnvRequireS3, err)
	}
	return url
}

func startS3(t testing.TB) (string, error) {
	gwOnce.Do(func() { gwPath, gwErr = findVersityGW() })
	if gwErr != nil {
		return "", gwErr
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", err
	}
	access, secret := randomHex(10), randomHex(20)

	// The free port may be taken by someone else before versitygw binds it;
	// then versitygw exits at once and another port is tried.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		srv, err := startGateway(gwPath, addr, access, secret, root, filepath.Join(dir, "versitygw.log"))
		if err != nil {
			lastErr = err
			continue
		}
		t.Cleanup(srv.stop)
		return fmt.Sprintf("s3://%s:%s@%s/sandboxd-test/blobs?tls=false", access, secret, addr), nil
	}
	return "", lastErr
}

// findVersityGW returns the path of a versitygw binary, building it when
// there is none.
func findVersityGW() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	goBin, err := goCommand()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(goBin, "env", "GOPATH").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOPATH: %w", err)
	}
	gopath := strings.TrimSpace(string(out))
	if i := strings.IndexByte(gopath, os.PathListSeparator); i >= 0 {
		gopath = gopath[:i] // go install writes into the first entry
	}
	p := filepath.Join(gopath, "bin", "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	cmd := exec.Command(goBin, "install", VersityGW)
	// The caller's module settings (say -mod=vendor) do not apply to
	// installing another module.
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %w\n%s", VersityGW, err, tail(out))
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("go install %s did not produce %s: %w", VersityGW, p, err)
	}
	fmt.Fprintf(os.Stderr, "blobtest: built versitygw in %v\n", time.Since(start).Round(time.Second))
	return p, nil
}

func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	// Test binaries often run with a PATH that lacks Go's own directory.
	const usual = "/usr/local/go/bin/go"
	if _, err := os.Stat(usual); err != nil {
		return "", errors.New("no go command on PATH or in /usr/local/go/bin to build versitygw with")
	}
	return usual, nil
}

type gateway struct {
	proc   *os.Process
	exited chan struct{}
}

func startGateway(bin, addr, access, secret, root, logPath string) (*gateway, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--access", access, "--secret", secret, "--port", addr, "--quiet", "posix", root)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Kill the server if the test process dies without cleaning up. The
	// parent-death signal fires when the creating thread exits, so the
	// server is started from a thread that stays locked until it is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start versitygw: %w", err)
	}
	g := &gateway{proc: cmd.Process, exited: exited}
	if err := g.waitReady(addr, 30*time.Second); err != nil {
		g.stop()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("versitygw on %s: %w\n%s", addr, err, tail(log))
	}
	return g, nil
}

// waitReady waits until the server answers HTTP; any answer will do (an
// unsigned request is refused, which proves it is serving).
func (g *gateway) waitReady(addr string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-g.exited:
			return errors.New("exited before answering")
		default:
		}
		resp, err := client.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no answer within %v: %w", timeout, lastErr)
}

func (g *gateway) stop() {
	_ = g.proc.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.proc.Kill()
		<-g.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tail returns the last lines of a log, enough to see why something failed.
func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	const limit = 4000
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return string(b)
}
