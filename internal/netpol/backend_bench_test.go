package netpol

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// benchBackend is a backend the benchmarks run on, with the prefix and
// pool of the network manager each makes for it (one at a time: each goes
// at the end of its sub-benchmark).
type benchBackend struct {
	name, prefix, pool string
	open               func(testing.TB) runtime.Runtime
}

func benchBackends(rootfs string) []benchBackend {
	return []benchBackend{
		{"gvisor", "tbg", "10.210.0.0/16", func(tb testing.TB) runtime.Runtime { return openGVisor(tb) }},
		{"microvm", "tbv", "10.211.0.0/16", func(tb testing.TB) runtime.Runtime { return openMicroVM(tb, rootfs) }},
	}
}

// BenchmarkStart measures what a network adds to a sandbox's start on each
// backend: from nothing to a first command's answer inside, without a
// network and with an egress one (netpol's Setup, then gVisor's netstack
// on the veth, or the microVM's tap, its redirects and the guest's link
// configured after the restore from the template), in the same run. The
// teardown is not timed.
//
//	go test -run '^$' -bench Start -benchtime 20x ./internal/netpol/
func BenchmarkStart(b *testing.B) {
	rootfs := runtimetest.Rootfs(b)
	for _, be := range benchBackends(rootfs) {
		b.Run(be.name, func(b *testing.B) {
			rt := be.open(b)
			m := newManager(b, be.prefix, be.pool, nil)
			for _, p := range []Policy{{Mode: ModeNone}, {Mode: ModeEgress}} {
				b.Run(string(p.Mode), func(b *testing.B) {
					benchStart(b, m, rt, rootfs, p)
				})
			}
		})
	}
}

func benchStart(b *testing.B, m *Manager, rt runtime.Runtime, rootfs string, p Policy) {
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench-%s-%d", p.Mode, i)
		t0 := time.Now()
		n, err := m.Setup(ctx, id, p)
		if err != nil {
			b.Fatal(err)
		}
		spec := runtime.Spec{ID: id, BaseDir: rootfs}
		if n != nil {
			spec.Network = guestNetwork(n)
		}
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		var out bytes.Buffer
		if res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}, Stdout: &out, Stderr: &out}); err != nil || res.ExitCode != 0 {
			b.Fatalf("first command: %v %+v %q", err, res, out.String())
		}
		total += time.Since(t0)
		b.StopTimer()
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/start")
}

// BenchmarkThroughput measures a download from the fake internet into a
// sandbox (busybox wget to /dev/null) on each backend, with the bandwidth
// limit raised out of the way: the path itself (gVisor's netstack; the
// microVM's virtio-net and tap, without offloads, under TCG where KVM is
// not usable), not the policy.
//
//	go test -run '^$' -bench Throughput -benchtime 3x ./internal/netpol/
func BenchmarkThroughput(b *testing.B) {
	const size = 64 << 20
	rootfs := runtimetest.Rootfs(b)
	for _, be := range benchBackends(rootfs) {
		b.Run(be.name, func(b *testing.B) {
			rt := be.open(b)
			inet := newInternet(b)
			l := listenIn(b, filepath.Join(netnsDir, inet.netns), netip.AddrPortFrom(inetA, 9200).String())
			go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(size))
				_, _ = io.CopyN(w, zeros{}, size)
			}))
			m := newManager(b, be.prefix, be.pool, func(o *Options) { o.RateBytes, o.BurstBytes = 4<<30, 64<<20 })
			ctx := context.Background()
			n, err := m.Setup(ctx, "bench-tput", Policy{Mode: ModeEgress})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = m.Teardown(context.Background(), "bench-tput") })
			sb, err := rt.Create(ctx, runtime.Spec{ID: "bench-tput", BaseDir: rootfs,
				Network: guestNetwork(n)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = sb.Destroy(context.Background()) })
			url := "http://" + netip.AddrPortFrom(inetA, 9200).String() + "/"
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var out bytes.Buffer
				res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"timeout", "300", "wget", "-q", "-O", "/dev/null", url}, Stdout: &out, Stderr: &out})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("download: %v %+v %q", err, res, out.String())
				}
			}
		})
	}
}
