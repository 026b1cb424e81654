package gvisor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// runScript runs a shell script in sb and returns its output and exit code.
func runScript(sb runtime.Sandbox, script string, timeout time.Duration) (string, string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errb bytes.Buffer
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), res.ExitCode, err
}

// shell is runScript that fails the test when the script cannot run.
func shell(t *testing.T, sb runtime.Sandbox, script string, timeout time.Duration) (string, string, int) {
	t.Helper()
	out, errs, code, err := runScript(sb, script, timeout)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return out, errs, code
}

func create(t *testing.T, r *gvisor.Runtime, base string, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	spec.ID = fmt.Sprintf("atk-%d-%s", time.Now().UnixNano()%1e9, spec.ID)
	spec.BaseDir, spec.BaseImage = base, "busybox-fixture"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

// homeServer stands for the sandboxd API on its unix socket: /slow holds
// its request until release is closed, counting how many it holds at once.
type homeServer struct {
	sock           string
	release        chan struct{}
	inflight, peak atomic.Int64
	served         atomic.Int64
	releaseOnce    sync.Once
	srv            *http.Server
}

func newHomeServer(t *testing.T) *homeServer {
	t.Helper()
	h := &homeServer{sock: filepath.Join(t.TempDir(), "api.sock"), release: make(chan struct{})}
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.served.Add(1)
		if r.URL.Path == "/slow" {
			n := h.inflight.Add(1)
			for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
			}
			select {
			case <-h.release:
			case <-time.After(time.Minute):
			}
			h.inflight.Add(-1)
		}
		fmt.Fprintf(w, "home %s\n", r.URL.Path)
	})}
	go h.srv.Serve(ln)
	t.Cleanup(func() { h.unblock(); h.srv.Close() })
	return h
}

func (h *homeServer) unblock() { h.releaseOnce.Do(func() { close(h.release) }) }

// TestHomeLimits: one sandbox opens 200 connections to sandboxd.internal
// at once, then makes requests as fast as it can; another sandbox is
// served all along.
func TestHomeLimits(t *testing.T) {
	securitytest.Attack(t, "guest", "a gVisor sandbox opens 200 concurrent connections to sandboxd.internal, then floods it with requests",
		"at most --internal-max-conns-per-sandbox reach the API, the rest are answered 429 and counted; requests past the rate get 429; another sandbox is served meanwhile")
	const maxConns, conns = 8, 200
	metrics := homegate.NewMetrics()
	base := runtimetest.Rootfs(t)
	r := newRuntime(t, t.TempDir(), func(o *gvisor.Options) {
		o.Home = homegate.Limits{MaxConns: maxConns, RequestsPerSecond: 0.2, Burst: 10}
		o.HomeMetrics = metrics
	})
	defer r.Close()
	home := newHomeServer(t)
	attacker := create(t, r, base, runtime.Spec{ID: "attacker", HomeSocket: home.sock})
	bystander := create(t, r, base, runtime.Spec{ID: "bystander", HomeSocket: home.sock})

	type result struct {
		out, errs string
		err       error
	}
	done := make(chan result, 1)
	go func() {
		out, errs, _, err := runScript(attacker, fmt.Sprintf(`
cd /tmp
for i in $(seq %d); do wget -q -O r$i http://sandboxd.internal/slow 2>e$i & done
wait
cat r* | grep -c 'home /slow'
cat e* | grep -c '429'
true`, conns), 2*time.Minute)
		done <- result{out, errs, err}
	}()
	// Wait until every one of the attacker's connections is accounted
	// for: held by the API (at most the cap) or refused with 429, for
	// the connection cap or the request rate. (A stable count is not
	// enough: on a loaded machine wget processes still start long after.)
	refusedConns, refusedRate := metrics.Refused(homegate.ReasonConns), metrics.Refused(homegate.ReasonRate)
	refused := func() float64 { return testutil.ToFloat64(refusedConns) + testutil.ToFloat64(refusedRate) }
	// (A few may instead be closed by the host before they said what
	// they are, uncounted: a count that stays put for 5 s ends the wait.)
	deadline := time.Now().Add(90 * time.Second)
	for last, since := -1.0, time.Now(); refused()+float64(home.inflight.Load()) < conns; time.Sleep(100 * time.Millisecond) {
		if n := refused(); n != last {
			last, since = n, time.Now()
		} else if home.inflight.Load() == maxConns && time.Since(since) > 5*time.Second {
			break
		}
		if time.Now().After(deadline) {
			home.unblock()
			res := <-done
			t.Fatalf("connections: %v refused, %d held after 90s; the attacker saw %q %q %v", refused(), home.inflight.Load(), res.out, res.errs, res.err)
		}
	}
	if got := testutil.ToFloat64(refusedConns); got == 0 || refused() < conns/2 {
		t.Errorf("%v refused for the connection cap and %v for the rate, want most of the %d beyond the cap refused", got, testutil.ToFloat64(refusedRate), conns-maxConns)
	}
	// The attacker is at its cap: the bystander is still served.
	if out, errs, code := shell(t, bystander, "wget -q -O- http://sandboxd.internal/fast", 30*time.Second); code != 0 || out != "home /fast\n" {
		t.Errorf("bystander while the attacker is at its cap: exit %d, %q %q", code, out, errs)
	}
	home.unblock()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	// Each connection was served or refused: answered 429 by the gate, or
	// (a few, in the burst) closed by the host before it said what it is.
	// The held ones are served once released (and any that only got there
	// after the release, on a loaded machine, within the cap: the peak
	// below is what the cap promises).
	var served, answered429 int
	if _, err := fmt.Sscan(res.out, &served, &answered429); err != nil || served < maxConns || answered429 < conns/2 {
		t.Errorf("attacker saw %q (served, answered 429), want the %d held served and most of the rest 429 (stderr %q)", res.out, maxConns, res.errs)
	}
	t.Logf("%d connections at once: %d served, %d answered 429, %d closed", conns, served, answered429, conns-served-answered429)
	if p := home.peak.Load(); p > maxConns {
		t.Errorf("the API held %d of the attacker's connections at once, cap %d", p, maxConns)
	}

	// Requests as fast as one connection at a time allows: the rate holds.
	// (busybox wget's -T crashes it, so none of these calls sets one.)
	before := home.served.Load()
	out, _, _ := shell(t, attacker, `ok=0; no=0
for i in $(seq 40); do if wget -q -O /dev/null http://sandboxd.internal/fast 2>/dev/null; then ok=$((ok+1)); else no=$((no+1)); fi; done
echo $ok $no`, time.Minute)
	var ok, no int
	if _, err := fmt.Sscan(out, &ok, &no); err != nil {
		t.Fatalf("rate output %q: %v", out, err)
	}
	t.Logf("40 requests in a row: %d served, %d refused; %v refused by rate", ok, no, testutil.ToFloat64(metrics.Refused(homegate.ReasonRate)))
	if no == 0 || ok+no != 40 || testutil.ToFloat64(metrics.Refused(homegate.ReasonRate)) < float64(no) {
		t.Errorf("rate limit: %d served, %d refused", ok, no)
	}
	if got := home.served.Load() - before; got != int64(ok) {
		t.Errorf("the API served %d requests, the sandbox saw %d succeed", got, ok)
	}
	if out, _, code := shell(t, bystander, "wget -q -O- http://sandboxd.internal/fast", 30*time.Second); code != 0 || out != "home /fast\n" {
		t.Errorf("bystander after the flood: exit %d, %q", code, out)
	}
}

// TestAgentTakeover: a second process in the sandbox connects to the agent
// socket and runs the agent handshake (with the real agent binary, with and
// without a guessed secret), and tries to read the real agent's secret.
func TestAgentTakeover(t *testing.T) {
	securitytest.Attack(t, "guest", "a second process in a gVisor sandbox runs the agent handshake on the agent socket to take over the host's session, and reads PID 1's environment for the secret",
		"the host refuses a peer that cannot prove the per-sandbox secret; the secret is not in /proc/1/environ; the host's session keeps working")
	state := t.TempDir()
	base := runtimetest.Rootfs(t)
	r := newRuntime(t, state, nil)
	defer r.Close()
	sb := create(t, r, base, runtime.Spec{ID: "takeover"})
	secret := agentSecret(t, state, sb.ID())

	out, _, _ := shell(t, sb, "cat /proc/1/environ 2>&1 | tr '\\0' '\\n'", 30*time.Second)
	if strings.Contains(out, secret) {
		t.Errorf("the agent's secret is readable inside: %q", out)
	}
	t.Logf("PID 1's environment seen from inside: %q", out)
	// Its memory (where the secret lives) is closed to other processes:
	// the agent is not dumpable and nothing inside has CAP_SYS_PTRACE.
	if out, errs, code := shell(t, sb, "dd if=/proc/1/mem of=/dev/null bs=1 count=1 2>&1", 30*time.Second); code == 0 || !strings.Contains(out+errs, "denied") {
		t.Errorf("open PID 1's memory from inside: exit %d, %q %q", code, out, errs)
	}

	// The impostor retries for 5 s; meanwhile and afterwards the host's
	// session must still be the real agent's: exec'd processes are
	// children of PID 1, not of the impostor.
	impostor := make(chan string, 1)
	go func() {
		o, e, _, err := runScript(sb, `
timeout 5 /run/sandboxd/bin/sandbox-agent --socket /run/sandboxd/sock/agent.sock --home "" --cwd /tmp &
SANDBOXD_AGENT_SECRET=`+strings.Repeat("00", 32)+` timeout 5 /run/sandboxd/bin/sandbox-agent --socket /run/sandboxd/sock/agent.sock --home "" --cwd /tmp &
wait; echo impostors done`, time.Minute)
		impostor <- fmt.Sprint(o, e, err)
	}()
	for i := range 10 {
		time.Sleep(400 * time.Millisecond)
		if out, _, code := shell(t, sb, "echo $PPID", 10*time.Second); code != 0 || strings.TrimSpace(out) != "1" {
			t.Fatalf("exec %d during the takeover attempt: parent %q (exit %d), want the real agent (1)", i, out, code)
		}
	}
	o := <-impostor
	if !strings.Contains(o, "impostors done") {
		t.Fatalf("impostor script: %q", o)
	}
	if out, _, code := shell(t, sb, "echo $PPID; echo still here", 10*time.Second); code != 0 || out != "1\nstill here\n" {
		t.Fatalf("after the takeover attempt: %q exit %d", out, code)
	}
}

// agentSecret reads the sandbox's agent secret from its host-side meta.json.
func agentSecret(t *testing.T, state, id string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(state, "ids", id))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(state, "sandboxes", filepath.Base(target), "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Secret string `json:"agent_secret"`
	}
	if err := json.Unmarshal(b, &m); err != nil || len(m.Secret) != 64 {
		t.Fatalf("meta.json agent_secret %q: %v", m.Secret, err)
	}
	return m.Secret
}
