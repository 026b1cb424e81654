package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/kernel"
	"github.com/sandboxd/sandboxd/internal/progress/display"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
)

// runtimeOptions are the flags of the sandbox backend: which one, the image
// its sandboxes start from, and what each sandbox and the node may take.
type runtimeOptions struct {
	runtimeName  string
	template     string
	rootfs       string
	platform     string
	runsc        string
	warmPool     int
	warmPoolMax  int
	prewarm      int
	templatePool int
	nodeCapacity int
	cpus         float64
	memoryMiB    int64
	pids         int64
	diskMiB      int64
	logMaxMiB    int64
	home         homegate.Limits
}

func (o *runtimeOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.runtimeName, "runtime", "gvisor", "sandbox backend (env SANDBOXD_RUNTIME): gvisor (the fastest strong one here) or microvm (QEMU; its kernel is built on first use, as by 'sandboxd kernel build'); fake simulates sandboxes for benchmarks and tests only (needs SANDBOXD_FAKE_RUNTIME=1)")
	f.StringVar(&o.template, "template", image.DefaultTemplate, "image template sandboxes start from, built on first use (env SANDBOXD_TEMPLATE): "+templateNames()+"; base and minimal suit smaller hosts but have no agent CLIs (prompts need full)")
	f.StringVar(&o.rootfs, "rootfs", "", "use this root filesystem directory instead of a built image (env SANDBOXD_ROOTFS)")
	f.StringVar(&o.runsc, "runsc", "", "the runsc binary (env SANDBOXD_RUNSC); empty: "+gvisor.BundledRunsc+" (scripts/install-runsc.sh) when a trial sandbox boots with it, else runsc in PATH")
	f.StringVar(&o.platform, "gvisor-platform", "", "gVisor platform (ptrace, systrap, kvm); empty probes for the fastest that works")
	f.IntVar(&o.warmPool, "warm-pool", 2, "sandboxes kept started ahead of time, at least (env SANDBOXD_WARM_POOL)")
	f.IntVar(&o.warmPoolMax, "warm-pool-max", 16, "what the warm pool grows to when creates come faster: as many as the last minute's creates of fresh sandboxes, within the disk the node can promise (each idle one holds about 15 MiB of host memory); at most --warm-pool keeps the pool at --warm-pool (env SANDBOXD_WARM_POOL_MAX)")
	f.IntVar(&o.prewarm, "prewarm", 8, "accounts whose next sandbox is kept started from their snapshot, least recently used dropped first (env SANDBOXD_PREWARM)")
	f.IntVar(&o.templatePool, "template-pool", 4, "sandboxes of custom templates kept started ahead, shared by the templates created from most lately (each as many as its creates in the last minute, at least 2 while the budget allows; at most 8 templates; a template's pool goes 10 minutes after its last create) (env SANDBOXD_TEMPLATE_POOL)")
	f.IntVar(&o.nodeCapacity, "node-capacity", 200, "concurrent sandboxes on this node; 0 unlimited")
	f.Float64Var(&o.cpus, "sandbox-cpus", 1, "CPU cores per sandbox; 0 unlimited")
	f.Int64Var(&o.memoryMiB, "sandbox-memory-mib", 1024, "memory per sandbox in MiB")
	f.Int64Var(&o.pids, "sandbox-pids", 512, "processes and threads per sandbox")
	f.Int64Var(&o.diskMiB, "sandbox-disk-mib", 4096, "size of a sandbox's writable layer in MiB; 0 unlimited")
	f.Int64Var(&o.logMaxMiB, "log-max-mib", 16, "cap in MiB of each log a sandbox fills (a run's log, gVisor's agent.log, a microVM's console and qemu.log): the head and the tail are kept, with a line saying how much was dropped (env SANDBOXD_LOG_MAX_MIB)")
	f.IntVar(&o.home.MaxConns, "internal-max-conns-per-sandbox", 32, "concurrent connections one sandbox may hold to sandboxd.internal (429 beyond); 0 unlimited")
	f.Float64Var(&o.home.RequestsPerSecond, "internal-requests-per-second", 50, "requests per second one sandbox may make to sandboxd.internal (429 beyond); 0 unlimited")
	f.IntVar(&o.home.Burst, "internal-request-burst", 100, "requests one sandbox may make to sandboxd.internal in a burst above --internal-requests-per-second")
}

// check refuses a backend, image or limit serve could not use, before the
// image is built (which may take minutes); --rootfs becomes absolute.
func (o *runtimeOptions) check() error {
	if o.runtimeName == fakeRuntimeName {
		if err := checkFakeRuntime(); err != nil {
			return err
		}
	} else if o.runtimeName != "gvisor" && o.runtimeName != "microvm" {
		return flagErrorf("runtime", "--runtime %q: unknown runtime (available: gvisor, microvm)", o.runtimeName)
	}
	switch o.platform {
	case "", "ptrace", "systrap", "kvm":
	default:
		return flagErrorf("gvisor-platform", "--gvisor-platform %q: want ptrace, systrap or kvm (empty: the fastest that works)", o.platform)
	}
	if err := o.checkImage(); err != nil {
		return err
	}
	if o.logMaxMiB < 1 || o.logMaxMiB > 1<<20 {
		return flagErrorf("log-max-mib", "--log-max-mib %d: want 1 to %d", o.logMaxMiB, 1<<20)
	}
	const counts = "0 (unlimited) or more"
	return firstError(
		atLeast("warm-pool", o.warmPool, 0, "0 (none) or more"),
		atLeast("warm-pool-max", o.warmPoolMax, 0, "0 or more"),
		atLeast("prewarm", o.prewarm, 0, "0 (none) or more"),
		atLeast("template-pool", o.templatePool, 0, "0 (none) or more"),
		atLeast("node-capacity", o.nodeCapacity, 0, counts),
		atLeast("sandbox-cpus", o.cpus, 0, counts),
		atLeast("sandbox-memory-mib", o.memoryMiB, 1, "1 or more"),
		atLeast("sandbox-pids", o.pids, 1, "1 or more"),
		atLeast("sandbox-disk-mib", o.diskMiB, 0, counts),
		atLeast("internal-max-conns-per-sandbox", o.home.MaxConns, 0, counts),
		atLeast("internal-requests-per-second", o.home.RequestsPerSecond, 0, counts),
		atLeast("internal-request-burst", o.home.Burst, 0, "0 or more"),
	)
}

// checkImage refuses an unknown --template, or a --rootfs that is not a
// directory.
func (o *runtimeOptions) checkImage() error {
	if o.rootfs == "" {
		if _, ok := image.LookupTemplate(o.template); !ok {
			return flagErrorf("template", "--template %q: unknown template (available: %s)", o.template, templateNames())
		}
		return nil
	}
	dir, err := filepath.Abs(o.rootfs)
	if err != nil {
		return flagErrorf("rootfs", "--rootfs %s: %w", o.rootfs, err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return flagErrorf("rootfs", "--rootfs %s is not a directory", o.rootfs)
	}
	o.rootfs = dir
	return nil
}

// sandboxRuntime is the sandbox backend and the image it starts from.
type sandboxRuntime struct {
	rt              runtime.Runtime
	baseDir, baseID string // the base image's root filesystem and id
	limits          runtime.Limits
	homeMetrics     *homegate.Metrics
	degraded        []gvisor.Degradation
}

// setupRuntime prepares the base image (built now if the cache lacks it,
// with progress on term) and starts the backend; the cleanup closes it.
func setupRuntime(ctx context.Context, g *globals, o runtimeOptions, dataDir string, term io.Writer, log *slog.Logger) (*sandboxRuntime, func(), error) {
	r := &sandboxRuntime{
		limits:      runtime.Limits{CPUs: o.cpus, MemoryBytes: o.memoryMiB << 20, Pids: o.pids, DiskBytes: o.diskMiB << 20},
		homeMetrics: homegate.NewMetrics(),
	}
	var err error
	if r.baseDir, r.baseID, err = resolveRootfs(ctx, g, o, term, log); err != nil {
		return nil, nil, err
	}
	if r.rt, err = openRuntime(ctx, g, o, dataDir, r, term, log); err != nil {
		return nil, nil, err
	}
	r.degraded = runtimeDegraded(r.rt)
	if len(r.degraded) > 0 && display.IsTerminal(term) && !g.jsonLogs() {
		// The runtime logged each at WARN; a person at the terminal of
		// `make run` must not miss them among the info lines.
		writeDegradedBanner(term, r.degraded)
	}
	return r, func() { r.rt.Close() }, nil
}

// resolveRootfs returns the root filesystem sandboxes start from: --rootfs
// (made absolute by check), or the template's image, built now if the
// cache lacks it.
func resolveRootfs(ctx context.Context, g *globals, o runtimeOptions, term io.Writer, log *slog.Logger) (dir, id string, err error) {
	if o.rootfs != "" {
		return o.rootfs, "rootfs:" + o.rootfs, nil
	}
	if o.runtimeName == fakeRuntimeName {
		return "", "fake", nil // nothing runs: no image
	}
	log = log.With("component", "image")
	img, err := image.NewStore(g.cacheDir, log).Ensure(ctx, o.template, g.tracker(term, log))
	if err != nil {
		return "", "", fmt.Errorf("prepare image %s: %w", o.template, err)
	}
	return img.Rootfs, img.ID, nil
}

// openRuntime starts the chosen sandbox backend on r's image and limits.
func openRuntime(ctx context.Context, g *globals, o runtimeOptions, dataDir string, r *sandboxRuntime, term io.Writer, log *slog.Logger) (runtime.Runtime, error) {
	switch o.runtimeName {
	case fakeRuntimeName:
		return newFakeRuntime(log.With("component", "runtime")), nil
	case "gvisor":
		rt, err := gvisor.New(ctx, gvisor.Options{
			StateDir:      filepath.Join(dataDir, "runtime", "gvisor"),
			RunscPath:     o.runsc,
			Platform:      o.platform,
			DefaultLimits: r.limits,
			WarmPool:      o.warmPool,
			Prewarm:       o.prewarm,
			MaxSandboxes:  o.nodeCapacity,
			WarmBaseDir:   r.baseDir,
			WarmBaseImage: r.baseID,
			LogMaxBytes:   o.logMaxMiB << 20,
			Home:          o.home,
			HomeMetrics:   r.homeMetrics,
			Logger:        log.With("component", "runtime"),
		})
		if err != nil {
			return nil, fmt.Errorf("start gvisor runtime: %w", err)
		}
		return rt, nil
	case "microvm":
		// QEMU microVMs with the kernel of `sandboxd kernel build`, built
		// now (with the same progress) when the cache lacks it; KVM when a
		// probe VM boots on it, TCG (slow) otherwise. New sandboxes start
		// from a memory snapshot of a booted template.
		klog := log.With("component", "kernel")
		if _, err := kernel.NewStore(g.cacheDir, klog).Ensure(ctx, g.tracker(term, klog)); err != nil {
			return nil, fmt.Errorf("prepare the microVM guest kernel: %w", err)
		}
		rt, err := microvm.New(ctx, microvm.Options{
			StateDir:      filepath.Join(dataDir, "runtime", "microvm"),
			CacheDir:      g.cacheDir,
			DefaultLimits: r.limits,
			Template:      microvm.TemplateOptions{BaseDir: r.baseDir, BaseImage: r.baseID},
			LogMaxBytes:   o.logMaxMiB << 20,
			Home:          o.home,
			HomeMetrics:   r.homeMetrics,
			Logger:        log.With("component", "runtime"),
		})
		if err != nil {
			return nil, fmt.Errorf("start microvm runtime: %w", err)
		}
		return rt, nil
	}
	return nil, flagErrorf("runtime", "unknown runtime %q (available: gvisor, microvm)", o.runtimeName)
}

// warmSandboxes is how many sandboxes the runtime's warm pool keeps
// started ahead: gVisor's (microVMs start from a memory snapshot instead).
// Prewarmed sandboxes are counted as they come (see admitDisk).
func (o *runtimeOptions) warmSandboxes() int {
	if o.runtimeName == "gvisor" {
		return o.warmPool
	}
	return 0
}

// warmSandboxesMax is what the warm pool may grow to (see warmSandboxes).
func (o *runtimeOptions) warmSandboxesMax() int {
	if o.runtimeName == "gvisor" {
		return o.warmPoolMax
	}
	return 0
}

// imageName names the base image in messages, without host paths.
func (o *runtimeOptions) imageName() string {
	if o.rootfs != "" {
		return "the --rootfs directory"
	}
	return "template " + o.template
}

// agentCommands says which agent CLIs the base image has.
func agentCommands(rootfs string) map[string]bool {
	have := map[string]bool{}
	for _, name := range []string{"opencode", "claude", "openclaw"} {
		have[name] = image.HasCommand(rootfs, name)
	}
	return have
}

// describeRuntime is the runtime in one line for GET /api/health: a
// backend that can say more (gVisor: platform and runsc) than its name.
func describeRuntime(rt runtime.Runtime) string {
	if d, ok := rt.(interface{ Describe() string }); ok {
		return d.Describe()
	}
	return rt.Name()
}

// runtimeDegraded is what the runtime lacks that a better setup would give
// it (gVisor: see gvisor.Runtime.Degraded); nil when nothing is.
func runtimeDegraded(rt runtime.Runtime) []gvisor.Degradation {
	if d, ok := rt.(interface{ Degraded() []gvisor.Degradation }); ok {
		return d.Degraded()
	}
	return nil
}

// degradedSummaries are the degradations as GET /api/health's degraded
// says them: public, no host paths.
func degradedSummaries(ds []gvisor.Degradation) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Summary)
	}
	return out
}

// writeDegradedBanner writes the degradations to a terminal as a box of
// wrapped lines: what is lost, then why, in full.
func writeDegradedBanner(w io.Writer, ds []gvisor.Degradation) {
	const width = 78
	rule := strings.Repeat("!", width)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n  sandboxd runs DEGRADED:\n", rule)
	for _, d := range ds {
		b.WriteString("\n")
		for i, line := range wrapWords(d.Summary, width-6) {
			lead := "    "
			if i == 0 {
				lead = "  * "
			}
			b.WriteString(lead + line + "\n")
		}
		for _, line := range wrapWords("why: "+d.Detail, width-6) {
			b.WriteString("      " + line + "\n")
		}
	}
	fmt.Fprintf(&b, "\n  GET /api/health lists these under \"degraded\".\n%s\n\n", rule)
	_, _ = io.WriteString(w, b.String())
}

// wrapWords breaks s into lines of at most width characters at spaces (a
// longer word has a line of its own).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
