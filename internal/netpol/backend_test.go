package netpol

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestGVisor runs busybox sandboxes under gVisor (--network=sandbox in
// the namespace Setup made) in each mode and checks, with busybox wget
// inside, what they reach.
func TestGVisor(t *testing.T) {
	rt := openGVisor(t)
	newInternet(t)
	m := newManager(t, "tng", "10.208.0.0/16", nil)
	t.Logf("gVisor: %s (the netns workaround: %v)", rt.Describe(), rt.Runsc().NetnsWorkaround)
	testBackend(t, m, rt, runtimetest.Rootfs(t))
}

// testLimits keep the tests' sandboxes small.
var testLimits = runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 256, DiskBytes: 64 << 20}

// openGVisor is a gVisor runtime for the test, closed at its end.
func openGVisor(tb testing.TB) *gvisor.Runtime {
	runtimetest.Require(tb, "runsc", "mkfs.ext4")
	rt, err := gvisor.New(context.Background(), gvisor.Options{
		StateDir:      tb.TempDir(),
		AgentPath:     runtimetest.AgentBinary(tb),
		Logger:        slog.New(slog.DiscardHandler),
		DefaultLimits: testLimits,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rt.Close() })
	return rt
}

// openMicroVM is a microVM runtime for the test whose memory-snapshot
// template (of rootfs) is ready; it is closed at the test's end.
func openMicroVM(tb testing.TB, rootfs string) *microvm.Runtime {
	k := runtimetest.MicroVMKernel(tb)
	rt, err := microvm.New(context.Background(), microvm.Options{
		StateDir:      tb.TempDir(),
		KernelPath:    k,
		AgentPath:     runtimetest.AgentBinary(tb),
		Logger:        runtimetest.Logger(tb),
		DefaultLimits: testLimits,
		Template:      microvm.TemplateOptions{BaseDir: rootfs, BaseImage: "busybox-fixture"},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rt.Close() })
	for deadline := time.Now().Add(5 * time.Minute); !rt.TemplateReady(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the memory-snapshot template was not ready in 5 minutes")
		}
	}
	return rt
}

// TestMicroVM runs the same checks on microVMs (a tap in the namespace
// Setup made, wired to its eth0). The sandboxes are restored from the
// memory-snapshot template, which has no network: each gets its own
// address and hardware address after the restore. A VM booted cold gets
// its network too, and a pause and resume keeps it.
func TestMicroVM(t *testing.T) {
	rootfs := runtimetest.Rootfs(t)
	rt := openMicroVM(t, rootfs)
	newInternet(t)
	m := newManager(t, "tnv", "10.209.0.0/16", nil)
	accel, _ := rt.Accel()
	t.Logf("microVM: %s", accel)
	boxes := testBackend(t, m, rt, rootfs)

	// Each guest took its namespace's eth0's place: its address and MAC,
	// not the template's.
	for mode, b := range boxes {
		if b.net == nil {
			if out, _ := wget(t, b.sb, "", []string{"ip", "-4", "addr", "show", "dev", "eth0"}); strings.Contains(out, "inet ") {
				t.Errorf("%s sandbox has an address: %q", mode, out)
			}
			continue
		}
		eth := nsLinkAttrs(t, b.net.Netns, "eth0")
		out, _ := wget(t, b.sb, "", []string{"ip", "addr", "show", "dev", "eth0"})
		if !strings.Contains(out, "inet "+b.net.GuestPrefix().String()) || !strings.Contains(out, eth.HardwareAddr.String()) {
			t.Errorf("%s sandbox's eth0 is not %s with %s: %q", mode, b.net.GuestPrefix(), eth.HardwareAddr, out)
		}
	}

	// A VM the template does not fit (another hostname; in production, an
	// account's snapshot to restore) boots cold with its network.
	ctx := context.Background()
	n, err := m.Setup(ctx, "microvm-cold", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Teardown(context.Background(), "microvm-cold") })
	cold, err := rt.Create(ctx, runtime.Spec{ID: "microvm-cold", BaseDir: rootfs, Hostname: "cold",
		Network: guestNetwork(n)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cold.Destroy(context.Background()) })
	if out, code := wget(t, cold, urlOf(inetB, 80), nil); code != 0 || !strings.HasPrefix(out, "hello from") {
		t.Errorf("egress from a cold-booted VM: exit %d %q", code, out)
	}

	// Pause and resume: the network comes back with the VM.
	eg := boxes[ModeEgress]
	if err := rt.Pause(ctx, eg.sb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, eg.sb.ID()); err != nil {
		t.Fatal(err)
	}
	if out, code := wget(t, eg.sb, urlOf(inetB, 80), nil); code != 0 || !strings.HasPrefix(out, "hello from") {
		t.Errorf("egress after pause and resume: exit %d %q", code, out)
	}
}

// guestNetwork is n as a runtime spec names it (what the sandbox
// manager's network hook gives the runtime).
func guestNetwork(n *Network) *runtime.Network {
	return &runtime.Network{Netns: n.Netns, Nameservers: n.Nameservers(), Address: n.GuestPrefix(), Gateway: n.HostAddr}
}

// nsLinkAttrs are the attributes of the link name in the namespace at path.
func nsLinkAttrs(t *testing.T, path, name string) *netlink.LinkAttrs {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs()
}

// box is a sandbox of testBackend and its network (nil: none).
type box struct {
	sb  runtime.Sandbox
	net *Network
}

// testBackend creates a sandbox on rt in each mode, with its network from
// m, and checks, with busybox wget inside, what each reaches: the home API
// always; the fake internet as its policy says; never the host, another
// sandbox, metadata or private ranges. The host reaches a server in the
// egress sandbox (as the port proxy does). The sandboxes and networks go
// at the test's end.
func testBackend(t *testing.T, m *Manager, rt runtime.Runtime, rootfs string) map[Mode]box {
	ctx := context.Background()
	// The home API, reached as http://sandboxd.internal.
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	home := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "home %s", r.URL.Path)
	})}
	go home.Serve(ln)
	t.Cleanup(func() { home.Close() })
	// The host's sandboxd port, on every host address.
	hostL, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostL.Close() })
	serveHTTP(hostL)
	hostPort := hostL.Addr().(*net.TCPAddr).Port
	hostAddrs := hostIPv4s(t)

	boxes := map[Mode]box{}
	for _, p := range []Policy{{Mode: ModeNone}, {Mode: ModeEgress}, {Mode: ModeAllow, Allow: []string{inetA.String(), testDomain}}} {
		id := rt.Name() + "-" + string(p.Mode)
		t0 := time.Now()
		n, err := m.Setup(ctx, id, p)
		if err != nil {
			t.Fatal(err)
		}
		spec := runtime.Spec{ID: id, BaseDir: rootfs, HomeSocket: sock}
		if n != nil {
			spec.Network = guestNetwork(n)
		}
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			if i := strings.Index(err.Error(), "(see "); i > 0 {
				b, _ := os.ReadFile(strings.TrimSuffix(err.Error()[i+5:], ")"))
				t.Logf("log: %s", b)
			}
			t.Fatalf("create %s sandbox: %v", p.Mode, err)
		}
		t.Logf("%s: network and sandbox up in %v", p.Mode, time.Since(t0))
		t.Cleanup(func() {
			if err := sb.Destroy(context.Background()); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
			if err := m.Teardown(context.Background(), id); err != nil {
				t.Errorf("teardown %s: %v", id, err)
			}
		})
		boxes[p.Mode] = box{sb, n}
	}

	// A server inside the egress sandbox: the host reaches it (as the port
	// proxy will), other sandboxes do not.
	eg := boxes[ModeEgress]
	if out, code := wget(t, eg.sb, "", []string{"sh", "-c", "mkdir -p /tmp/www && echo guest-page > /tmp/www/index.html && httpd -p 8080 -h /tmp/www"}); code != 0 {
		t.Fatalf("start httpd in the sandbox: %d %q", code, out)
	}
	guestURL := urlOf(eg.net.GuestAddr, 8080)
	var body string
	for range 50 { // httpd daemonizes: give it a moment to listen
		if resp, err := http.Get(guestURL); err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			body = b.String()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if body != "guest-page\n" {
		t.Errorf("host to the guest's server at %s: %q", guestURL, body)
	}

	type check struct {
		mode  Mode
		url   string
		reach bool
	}
	var checks []check
	for mode, b := range boxes {
		checks = append(checks,
			check{mode, "http://sandboxd.internal/api/health", true},
			check{mode, urlOf(inetA, 80), mode != ModeNone},
			check{mode, urlOf(inetB, 80), mode == ModeEgress},
			// By name, through the sandbox's resolver on its gateway.
			check{mode, "http://" + testDomain + "/", mode != ModeNone},
			check{mode, urlOf(inetMetadata, 80), false},
			check{mode, urlOf(inetPrivate, 80), false},
		)
		for _, a := range hostAddrs {
			checks = append(checks, check{mode, urlOf(a, hostPort), false})
		}
		if b.net != nil {
			checks = append(checks, check{mode, urlOf(b.net.HostAddr, hostPort), false})
		}
		if mode != ModeEgress {
			checks = append(checks, check{mode, guestURL, false})
		}
	}
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, code := wget(t, boxes[c.mode].sb, c.url, nil)
			switch {
			case c.reach && code != 0:
				t.Errorf("%s sandbox cannot reach %s: exit %d %q", c.mode, c.url, code, out)
			case c.reach && !strings.HasPrefix(out, "hello from") && !strings.HasPrefix(out, "home /api/health"):
				t.Errorf("%s sandbox got %q from %s", c.mode, out, c.url)
			case !c.reach && code == 0:
				t.Errorf("%s sandbox reached %s: %q", c.mode, c.url, out)
			}
		}()
	}
	wg.Wait()
	// DNS: the namespace's resolvers are the guest's.
	out, _ := wget(t, eg.sb, "", []string{"cat", "/etc/resolv.conf"})
	if !strings.Contains(out, "nameserver "+eg.net.HostAddr.String()) {
		t.Errorf("guest resolv.conf: %q", out)
	}
	return boxes
}

// wget fetches url with busybox wget inside sb (or runs cmd) and returns
// its output and exit code.
func wget(t *testing.T, sb runtime.Sandbox, url string, cmd []string) (string, int) {
	t.Helper()
	if cmd == nil {
		// busybox wget's own -T crashes under this gVisor (SIGSEGV from
		// its alarm handling), so timeout(1) bounds it instead.
		cmd = []string{"timeout", "3", "wget", "-q", "-O-", url}
	}
	var stdout, stderr bytes.Buffer
	res, err := sb.Exec(context.Background(), runtime.ExecRequest{Cmd: cmd, Stdout: &stdout, Stderr: &stderr, Timeout: 30 * time.Second})
	if err != nil {
		t.Errorf("exec %v: %v", cmd, err)
		return "", -1
	}
	return stdout.String() + stderr.String(), res.ExitCode
}
