// Package bench measures the sandbox runtime on this host and reports the
// figures `sandboxd bench` prints: create-to-running (cold and from the warm
// pool), exec round trip (through the agent, and `runsc exec` for
// comparison), the start of many concurrent sandboxes and the host memory of
// an idle one, snapshot and restore of a layer with 100 MiB changed, and the
// bare `runsc run` of the same root filesystem as the baseline.
//
// It reports numbers; it never judges them. Everything it starts lives under
// one scratch state directory and is destroyed before Run returns.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// phases shows a benchmark's phases as one task: the n-th of a known
// number, by name.
type phases struct {
	task progress.Task
	n    int64
}

func startPhases(t progress.Tracker, title string, total int) *phases {
	return &phases{task: t.Start(title, progress.Steps, int64(total))}
}

// next starts the next phase.
func (p *phases) next(name string) {
	p.task.Update(progress.State{Step: name, Current: p.n})
	p.n++
}

func (p *phases) done(err error) { p.task.Done(err) }

// Options say what to measure and where.
type Options struct {
	Rootfs     string // base root filesystem
	StateDir   string // scratch; created and removed
	AgentPath  string
	RunscPath  string // empty: the one the runtime chooses (gvisor.New)
	Platform   string // gVisor platform; empty: probed
	Iterations int    // samples per timing (default 20)
	Concurrent int    // sandboxes started at once (default 50)
	LayerMiB   int    // data changed before the snapshot (default 100)
	Limits     runtime.Limits
	Logger     *slog.Logger
	// Progress, when set, is shown the phases.
	Progress progress.Tracker
}

// Timing is a distribution in milliseconds. Samples, in the order they
// were taken, are what the charts draw.
type Timing struct {
	N       int       `json:"n"`
	P50     float64   `json:"p50_ms"`
	P90     float64   `json:"p90_ms"`
	Min     float64   `json:"min_ms"`
	Max     float64   `json:"max_ms"`
	Samples []float64 `json:"samples_ms,omitempty"`
}

func timing(ds []time.Duration) Timing {
	if len(ds) == 0 {
		return Timing{}
	}
	q := quantiles(ds)
	return Timing{N: len(ds), P50: q(0.5), P90: q(0.9), Min: q(0), Max: q(1), Samples: samples(ds)}
}

// samples are ds in milliseconds, rounded as the quantiles are.
func samples(ds []time.Duration) []float64 {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = round(float64(d.Microseconds()) / 1000)
	}
	return ms
}

// quantiles sorts ds (not empty) and returns its quantile function, in
// milliseconds: q(0) is the least, q(1) the greatest.
func quantiles(ds []time.Duration) func(p float64) float64 {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	sort.Float64s(ms)
	return func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ms)))) - 1
		return round(ms[max(0, min(i, len(ms)-1))])
	}
}

func round(f float64) float64 { return math.Round(f*100) / 100 }

// Report is what Run measured.
type Report struct {
	Backend  string `json:"backend"`
	Platform string `json:"platform"`
	Runsc    string `json:"runsc"`
	Kernel   string `json:"guest_kernel"`
	CPUs     int    `json:"host_cpus"`
	Rootfs   string `json:"rootfs"`

	CreateCold Timing `json:"create_cold"` // Create until the agent answers
	CreateWarm Timing `json:"create_warm"` // Create served by the warm pool
	ExecTrue   Timing `json:"exec_true"`   // `true` through the agent
	ListDir    Timing `json:"list_dir"`    // ListDir("/") through the agent: the protocol's round trip, nothing forked
	RunscExec  Timing `json:"runsc_exec_true"`

	Concurrent struct {
		N            int     `json:"n"`
		TotalMs      float64 `json:"total_ms"` // all of them running
		Each         Timing  `json:"each"`
		IdleRSSMiB   float64 `json:"idle_rss_mib_per_sandbox"` // sentry + gofer, summed RSS
		IdlePSSMiB   float64 `json:"idle_pss_mib_per_sandbox"` // shared pages split fairly
		IdleCgroupMB float64 `json:"idle_cgroup_mib_per_sandbox"`
	} `json:"concurrent"`

	Snapshot struct {
		ChangedMiB   int     `json:"changed_mib"`
		QuiesceMs    float64 `json:"quiesce_ms"`  // first sync of the fresh writes + pause + resume
		SnapshotMs   float64 `json:"snapshot_ms"` // then Snapshot: sync, pause, tar + zstd, resume
		LayerMiB     float64 `json:"layer_mib"`   // compressed
		ApplyMs      float64 `json:"apply_ms"`    // unpack into a fresh directory
		RestoreMs    float64 `json:"restore_ms"`  // Create with the layer until running
		VerifiedSame bool    `json:"verified_same"`
	} `json:"snapshot"`

	Baseline struct {
		RunscRun      Timing  `json:"runsc_run"` // runsc run of the rootfs, /bin/true, to exit
		ColdRatio     float64 `json:"create_cold_over_runsc_run"`
		WarmRatio     float64 `json:"create_warm_over_runsc_run"`
		RunscDetachMs Timing  `json:"runsc_run_detach"` // runsc run -detach of the agent, to return
	} `json:"baseline"`
}

func (o *Options) defaults() {
	if o.Iterations <= 0 {
		o.Iterations = 20
	}
	if o.Concurrent <= 0 {
		o.Concurrent = 50
	}
	if o.LayerMiB <= 0 {
		o.LayerMiB = 100
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Progress = progress.Or(o.Progress)
	if o.Limits == (runtime.Limits{}) {
		o.Limits = runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, Pids: 1024, DiskBytes: 1 << 30}
	}
}

// Run measures and cleans up after itself.
func Run(ctx context.Context, o Options) (_ Report, err error) {
	o.defaults()
	var rep Report
	rep.Rootfs = o.Rootfs
	rep.Platform = o.Platform // empty: the first runtime's probe fills it
	rep.CPUs = goruntime.NumCPU()
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	b := &bencher{o: o, rep: &rep}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"create (cold) and exec", b.cold},
		{"create (warm pool)", b.warm},
		{"concurrent start and idle memory", b.concurrent},
		{"snapshot and restore", b.snapshot},
		{"runsc run baseline", b.baseline},
	}
	ph := startPhases(o.Progress, "bench", len(steps))
	defer func() { ph.done(err) }()
	for _, s := range steps {
		ph.next(s.name)
		if err := s.fn(ctx); err != nil {
			return rep, fmt.Errorf("bench %s: %w", s.name, err)
		}
	}
	if p := rep.Baseline.RunscRun.P50; p > 0 {
		rep.Baseline.ColdRatio = math.Round(rep.CreateCold.P50/p*1000) / 1000
		rep.Baseline.WarmRatio = math.Round(rep.CreateWarm.P50/p*1000) / 1000
	}
	return rep, nil
}

type bencher struct {
	o   Options
	rep *Report
	n   int
	mu  sync.Mutex
}

func (b *bencher) id(prefix string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	return fmt.Sprintf("bench-%s-%d", prefix, b.n)
}

// newRuntime makes a runtime on its own state dir; the platform probed by
// the first is reused by the rest.
func (b *bencher) newRuntime(ctx context.Context, name string, warm int) (*gvisor.Runtime, error) {
	rt, err := gvisor.New(ctx, gvisor.Options{
		StateDir: filepath.Join(b.o.StateDir, name), RunscPath: b.o.RunscPath, AgentPath: b.o.AgentPath,
		Platform: b.rep.Platform, DefaultLimits: b.o.Limits, WarmPool: warm, WarmBaseDir: b.o.Rootfs,
		WarmBaseImage: "bench", Logger: b.o.Logger,
	})
	if err == nil && b.rep.Platform == "" {
		b.rep.Platform, _ = rt.Platform()
	}
	// The rest of the run, bare runsc included, uses the runsc the first
	// runtime chose.
	if err == nil && b.o.RunscPath == "" {
		b.o.RunscPath = rt.Runsc().Path
	}
	return rt, err
}

func (b *bencher) spec(prefix string) runtime.Spec {
	return runtime.Spec{ID: b.id(prefix), BaseDir: b.o.Rootfs, BaseImage: "bench"}
}

// cold measures create-to-running without a pool, then exec round trips.
func (b *bencher) cold(ctx context.Context) error {
	rt, err := b.newRuntime(ctx, "cold", 0)
	if err != nil {
		return err
	}
	defer rt.Close()
	b.rep.Backend = rt.Name()
	b.rep.Runsc = rt.Runsc().String()
	var ds []time.Duration
	for range b.o.Iterations {
		start := time.Now()
		sb, err := rt.Create(ctx, b.spec("cold"))
		if err != nil {
			return err
		}
		ds = append(ds, time.Since(start))
		b.rep.Kernel = sb.Info().Kernel
		if err := sb.Destroy(ctx); err != nil {
			return err
		}
	}
	b.rep.CreateCold = timing(ds)

	sb, err := rt.Create(ctx, b.spec("exec"))
	if err != nil {
		return err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	ds = ds[:0]
	for i := range b.o.Iterations * 10 {
		start := time.Now()
		res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			return fmt.Errorf("exec true: %v (exit %d)", err, res.ExitCode)
		}
		if i > 0 { // the first one warms caches
			ds = append(ds, time.Since(start))
		}
	}
	b.rep.ExecTrue = timing(ds)

	ds = ds[:0]
	for i := range b.o.Iterations * 10 {
		start := time.Now()
		if _, err := sb.ListDir(ctx, "/"); err != nil {
			return fmt.Errorf("list /: %w", err)
		}
		if i > 0 {
			ds = append(ds, time.Since(start))
		}
	}
	b.rep.ListDir = timing(ds)

	// The same through `runsc exec`, the alternative to the agent.
	cid, err := containerID(filepath.Join(b.o.StateDir, "cold"), sb.ID())
	if err != nil {
		return err
	}
	ds = ds[:0]
	for range b.o.Iterations {
		cmd := exec.CommandContext(ctx, runscPath(b.o.RunscPath), "--root", filepath.Join(b.o.StateDir, "cold", "runsc"), "exec", cid, "/bin/true")
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("runsc exec: %v: %s", err, out)
		}
		ds = append(ds, time.Since(start))
	}
	b.rep.RunscExec = timing(ds)
	return nil
}

func containerID(state, id string) (string, error) {
	t, err := os.Readlink(filepath.Join(state, "ids", id))
	if err != nil {
		return "", fmt.Errorf("find container of %s: %w", id, err)
	}
	return filepath.Base(t), nil
}

func runscPath(p string) string {
	if p != "" {
		return p
	}
	return gvisor.DefaultRunsc()
}

// warm measures Create served by a pool that had time to refill.
func (b *bencher) warm(ctx context.Context) error {
	const pool = 2
	rt, err := b.newRuntime(ctx, "warm", pool)
	if err != nil {
		return err
	}
	defer rt.Close()
	var ds []time.Duration
	for range b.o.Iterations {
		deadline := time.Now().Add(time.Minute)
		for rt.WarmReady() < pool {
			if time.Now().After(deadline) {
				return errors.New("warm pool did not fill within a minute")
			}
			time.Sleep(20 * time.Millisecond)
		}
		start := time.Now()
		sb, err := rt.Create(ctx, b.spec("warm"))
		if err != nil {
			return err
		}
		ds = append(ds, time.Since(start))
		if err := sb.Destroy(ctx); err != nil {
			return err
		}
	}
	b.rep.CreateWarm = timing(ds)
	return nil
}

// concurrent starts N sandboxes at once, lets them idle, and measures the
// host memory their sentries and gofers hold.
func (b *bencher) concurrent(ctx context.Context) error {
	rt, err := b.newRuntime(ctx, "many", 0)
	if err != nil {
		return err
	}
	defer rt.Close()
	n := b.o.Concurrent
	sbs := make([]runtime.Sandbox, n)
	ds := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			sbs[i], errs[i] = rt.Create(ctx, b.spec("many"))
			ds[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	total := time.Since(start)
	defer func() {
		for _, sb := range sbs {
			if sb != nil {
				_ = sb.Destroy(context.WithoutCancel(ctx))
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.rep.Concurrent.N = n
	b.rep.Concurrent.TotalMs = round(float64(total.Microseconds()) / 1000)
	b.rep.Concurrent.Each = timing(ds)
	// Idle: give the sentries a moment to settle after boot.
	time.Sleep(3 * time.Second)
	rss, pss := processMemory(filepath.Join(b.o.StateDir, "many", "runsc"))
	b.rep.Concurrent.IdleRSSMiB = round(float64(rss) / float64(n) / (1 << 20))
	b.rep.Concurrent.IdlePSSMiB = round(float64(pss) / float64(n) / (1 << 20))
	var cg int64
	for _, sb := range sbs {
		st, err := sb.Stats(ctx)
		if err != nil {
			return err
		}
		cg += st.MemoryBytes
	}
	b.rep.Concurrent.IdleCgroupMB = round(float64(cg) / float64(n) / (1 << 20))
	return nil
}

// processMemory sums RSS and PSS of the processes runsc started with root.
func processMemory(root string) (rss, pss int64) {
	for _, p := range runscProcs(root) {
		rss += statusKB(filepath.Join(p, "status"), "VmRSS:") << 10
		pss += statusKB(filepath.Join(p, "smaps_rollup"), "Pss:") << 10
	}
	return rss, pss
}

// runscProcs are the /proc directories of the processes runsc started
// with root (sentries, gofers).
func runscProcs(root string) []string {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte("--root="+root)) {
			out = append(out, p)
		}
	}
	return out
}

func statusKB(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// snapshot changes LayerMiB inside a sandbox, snapshots it, and restores it
// into a new sandbox.
func (b *bencher) snapshot(ctx context.Context) error {
	rt, err := b.newRuntime(ctx, "snap", 0)
	if err != nil {
		return err
	}
	defer rt.Close()
	src, err := rt.Create(ctx, b.spec("snap"))
	if err != nil {
		return err
	}
	defer src.Destroy(context.WithoutCancel(ctx))
	// Incompressible data in 1 MiB files written from the host through the
	// agent: the worst case for zstd, and a realistic file count.
	buf := make([]byte, 1<<20)
	for i := range b.o.LayerMiB {
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		if err := src.WriteFile(ctx, fmt.Sprintf("/workspace/data/%03d.bin", i), bytes.NewReader(buf), 0o644); err != nil {
			return err
		}
	}
	want, err := digestTree(ctx, src)
	if err != nil {
		return err
	}
	layer, err := os.CreateTemp(b.o.StateDir, "layer-*.tar.zst")
	if err != nil {
		return err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	// Quiesce first on its own: flushing what was just written is most of a
	// snapshot's cost under gVisor, and worth seeing apart from the archive.
	start := time.Now()
	resume, err := src.Quiesce(ctx)
	if err != nil {
		return err
	}
	if err := resume(ctx); err != nil {
		return err
	}
	b.rep.Snapshot.QuiesceMs = ms(time.Since(start))
	start = time.Now()
	m, err := src.Snapshot(ctx, layer)
	if err != nil {
		return err
	}
	b.rep.Snapshot.SnapshotMs = ms(time.Since(start))
	b.rep.Snapshot.ChangedMiB = b.o.LayerMiB
	b.rep.Snapshot.LayerMiB = round(float64(m.Size) / (1 << 20))

	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(b.o.StateDir, "apply-")
	if err != nil {
		return err
	}
	start = time.Now()
	if _, err := snapshot.Apply(ctx, layer, scratch, nil); err != nil {
		return err
	}
	b.rep.Snapshot.ApplyMs = ms(time.Since(start))
	_ = os.RemoveAll(scratch)

	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return err
	}
	spec := b.spec("restore")
	spec.Layers = []runtime.Layer{{ID: m.ID, R: layer}}
	start = time.Now()
	dst, err := rt.Create(ctx, spec)
	if err != nil {
		return err
	}
	b.rep.Snapshot.RestoreMs = ms(time.Since(start))
	defer dst.Destroy(context.WithoutCancel(ctx))
	got, err := digestTree(ctx, dst)
	if err != nil {
		return err
	}
	b.rep.Snapshot.VerifiedSame = got == want
	return nil
}

func digestTree(ctx context.Context, sb runtime.Sandbox) (string, error) {
	var out bytes.Buffer
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "cd /workspace/data && sha256sum * | sha256sum"}, Stdout: &out})
	if err != nil || res.ExitCode != 0 {
		return "", fmt.Errorf("hash the data inside: %v (exit %d)", err, res.ExitCode)
	}
	return out.String(), nil
}

func ms(d time.Duration) float64 { return round(float64(d.Microseconds()) / 1000) }

// writeBundle writes an OCI bundle's config.json in dir: rootfs read-only,
// args as the process, /proc and mounts, its own namespaces and no network.
func writeBundle(dir, rootfs string, args []string, mounts ...map[string]string) error {
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process":    map[string]any{"args": args, "cwd": "/", "env": []string{"PATH=/bin:/usr/bin"}, "user": map[string]int{"uid": 0, "gid": 0}},
		"root":       map[string]any{"path": rootfs, "readonly": true},
		"mounts":     append([]map[string]string{{"destination": "/proc", "type": "proc", "source": "proc"}}, mounts...),
		"linux":      map[string]any{"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), js, 0o600)
}

// runscDetached runs runsc (run --detach, restore --detach) with its
// output in the file logPath: the detached sandbox keeps the output it was
// given open, and a pipe would never end. A failure carries the log.
func runscDetached(ctx context.Context, runsc, root, platform, logPath string, args ...string) error {
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := runscCmd(ctx, runsc, root, platform, args...)
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	log.Close()
	if err != nil {
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("runsc %s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, tail(string(out), 2000))
	}
	return nil
}

// tmpfsMount is a writable directory for a bundle of a read-only rootfs.
func tmpfsMount(dest string) map[string]string {
	return map[string]string{"destination": dest, "type": "tmpfs", "source": "tmpfs"}
}

// runscCmd is bare runsc with a state root, a platform and no network.
func runscCmd(ctx context.Context, runsc, root, platform string, args ...string) *exec.Cmd {
	g := []string{"--root", root, "--platform", platform, "--network", "none"}
	return exec.CommandContext(ctx, runscPath(runsc), append(g, args...)...)
}

// baseline times the bare `runsc run` of the same root filesystem: a bundle
// with the rootfs read-only and /bin/true, from start to exit, and the
// detached start of a long-running process.
func (b *bencher) baseline(ctx context.Context) error {
	dir := filepath.Join(b.o.StateDir, "baseline")
	root := filepath.Join(dir, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	defer gvisor.ReleaseRoot(root)
	write := func(args []string) error { return writeBundle(dir, b.o.Rootfs, args) }
	runsc := func(args ...string) *exec.Cmd { return runscCmd(ctx, b.o.RunscPath, root, b.rep.Platform, args...) }
	if err := write([]string{"/bin/true"}); err != nil {
		return err
	}
	var ds []time.Duration
	for i := range b.o.Iterations {
		cid := fmt.Sprintf("baseline-%d", i)
		start := time.Now()
		out, err := runsc("run", "--bundle", dir, cid).CombinedOutput()
		ds = append(ds, time.Since(start))
		_ = runsc("delete", "--force", cid).Run()
		if err != nil {
			return fmt.Errorf("runsc run: %v: %s", err, out)
		}
	}
	b.rep.Baseline.RunscRun = timing(ds)
	if err := write([]string{"/bin/sleep", "1000"}); err != nil {
		return err
	}
	ds = ds[:0]
	for i := range b.o.Iterations {
		cid := fmt.Sprintf("baseline-detach-%d", i)
		start := time.Now()
		err := runscDetached(ctx, b.o.RunscPath, root, b.rep.Platform, filepath.Join(dir, "detach.log"), "run", "--detach", "--bundle", dir, cid)
		ds = append(ds, time.Since(start))
		_ = runsc("delete", "--force", cid).Run()
		if err != nil {
			return err
		}
	}
	b.rep.Baseline.RunscDetachMs = timing(ds)
	return nil
}
