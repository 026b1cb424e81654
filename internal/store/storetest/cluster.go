package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Debian's postgresql-15 binaries, used for the throwaway cluster.
const (
	pgBinDir     = "/usr/lib/postgresql/15/bin"
	initdbPath   = pgBinDir + "/initdb"
	postgresPath = pgBinDir + "/postgres"
)

// The throwaway cluster is per test process, so its state is too: every
// test of the process shares one server and gets its own database on it.
var (
	clusterOnce sync.Once
	clusterURL  string
	clusterErr  error
	theCluster  *cluster
)

// postgresServer returns the URL of the PostgreSQL server to create test
// databases on, or "" when there is none.
func postgresServer() (string, error) {
	if u := os.Getenv(EnvPostgres); u != "" {
		return u, nil
	}
	if _, err := os.Stat(initdbPath); err != nil {
		return "", nil
	}
	clusterOnce.Do(func() {
		theCluster, clusterErr = startCluster()
		if clusterErr == nil {
			clusterURL = theCluster.url
		}
	})
	return clusterURL, clusterErr
}

// stopCluster stops the throwaway cluster, if one was started, and waits
// until its directory is gone.
func stopCluster() {
	if theCluster != nil {
		theCluster.stop()
	}
}

type cluster struct {
	dir    string
	url    string
	sh     *os.Process
	exited chan struct{} // closed when the supervising shell has exited
}

// supervisor runs postgres and removes the cluster's directory once it has
// stopped. TERM (sent by Main, or by the kernel when the test process dies:
// the parent-death signal) asks postgres for a fast shutdown.
const supervisor = `
D="$1"; shift
pid=""; stopping=""
stop() { stopping=1; [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null; }
trap stop TERM INT HUP
"$@" >"$D/postgres.log" 2>&1 &
pid=$!
[ -n "$stopping" ] && kill -INT "$pid" 2>/dev/null
wait "$pid"
wait "$pid"
rm -rf "$D"
`

func startCluster() (*cluster, error) {
	dir, err := os.MkdirTemp("", "sandboxd-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	// initdb and postgres refuse to run as root: run them as the postgres
	// user, which must own the directory.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start postgres as root: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(initdbPath, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}

	// The port was free a moment ago; if something takes it before postgres
	// binds it, the start fails and the test reports why.
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	return runPostgres(dir, data, port, cred)
}

func runPostgres(dir, data string, port int, cred *syscall.Credential) (*cluster, error) {
	cmd := exec.Command("/bin/sh", "-c", supervisor, "sh", dir,
		postgresPath, "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		// Durability is worthless for a throwaway cluster; speed is not.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}

	// The parent-death signal fires when the thread that started the child
	// exits, not the process: start it from a thread that stays locked (and
	// so alive) until the child is gone.
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
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	c := &cluster{
		dir:    dir,
		url:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		sh:     cmd.Process,
		exited: exited,
	}
	if err := c.waitReady(60 * time.Second); err != nil {
		logTail := readTail(filepath.Join(dir, "postgres.log"))
		c.stop()
		return nil, fmt.Errorf("start postgres on port %d: %w\n%s", port, err, logTail)
	}
	return c, nil
}

func (c *cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			return errors.New("postgres exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		lastErr = ping(ctx, c.url)
		cancel()
		if lastErr == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %w", timeout, lastErr)
}

func ping(ctx context.Context, dsn string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

func (c *cluster) stop() {
	_ = c.sh.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-c.sh.Pid, syscall.SIGKILL)
		<-c.exited
		os.RemoveAll(c.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// readTail returns the end of a log file, for error messages.
func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const max = 4000
	s := string(b)
	if len(s) > max {
		s = s[len(s)-max:]
	}
	return strings.TrimSpace(s)
}
