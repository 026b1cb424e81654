// Package kernel builds and caches the minimal guest kernel that microVM
// sandboxes boot (runtime/microvm): Debian's linux-source tarball configured
// with allnoconfig plus the fragment kept in this package
// (config/sandboxd.config), built as an uncompressed vmlinux that QEMU loads
// directly through its PVH entry point — no decompressor, no bootloader.
//
// A kernel lives in <cache-dir>/kernels/<release>-<key12>/ as vmlinux, the
// final .config and kernel.json. Its key hashes the fragment, the source
// (Debian package version, or the tarball's size and mtime) and the builder's
// format version, so a changed fragment or a new linux-source package builds
// a new kernel beside the old one.
//
// Invariants:
//   - A kernel directory exists only when complete: the build runs in a
//     dot-directory beside it, and the result is renamed into place after
//     kernel.json is written and synced. A crash leaves a dot-directory that
//     the next build removes.
//   - At most one build of a key runs at a time across processes (flock on
//     <id>.lock next to the directory).
//   - Every option the fragment sets survives into the final .config; a
//     fragment option whose dependencies are missing fails the build rather
//     than silently producing a kernel without it.
package kernel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/renameio/v2"

	"github.com/sandboxd/sandboxd/internal/flock"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// Fragment is the kernel configuration fragment applied over allnoconfig.
//
//go:embed config/sandboxd.config
var Fragment []byte

// formatVersion changes when the build procedure changes in a way that
// affects the result, so older cached kernels are not reused.
const formatVersion = 1

// LocalVersion is appended to the kernel release (uname -r inside).
const LocalVersion = "-sandboxd"

// InstallCommand installs the kernel source and everything building it
// takes, on Debian 12 (scripts/install-deps.sh does the same).
const InstallCommand = "apt-get install -y linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev xz-utils"

// ErrNotBuilt is returned by Lookup when the kernel for the current source
// and fragment is not in the cache.
var ErrNotBuilt = errors.New("guest kernel not built (run `sandboxd kernel build`)")

// Kernel is a built guest kernel in the cache.
type Kernel struct {
	// ID is "<release>-<first 12 hex digits of Key>".
	ID string `json:"id"`
	// Key is the content key (fragment, source, format version).
	Key string `json:"key"`
	// Release is the kernel release, e.g. "6.1.192-sandboxd".
	Release string `json:"release"`
	// Source is the tarball the kernel was built from and SourceVersion
	// its Debian package version (empty when not from a package).
	Source        string `json:"source"`
	SourceVersion string `json:"source_version,omitempty"`
	// Path is the vmlinux (ELF with a PVH entry note), Config the .config.
	Path   string `json:"path"`
	Config string `json:"config"`
	// Size is the size of vmlinux in bytes.
	Size          int64         `json:"size"`
	Jobs          int           `json:"jobs"`
	CreatedAt     time.Time     `json:"created"`
	BuildDuration time.Duration `json:"-"` // in JSON as build_seconds
	BuildSeconds  float64       `json:"build_seconds"`
}

// BuildOptions tune Build.
type BuildOptions struct {
	// Source is the linux-source tarball; empty: the newest
	// /usr/src/linux-source-*.tar.xz.
	Source string
	// Jobs is make's -j; 0: the number of CPUs.
	Jobs int
	// Force rebuilds even when the kernel is cached.
	Force bool
}

// Store is the kernel cache under <cache-dir>/kernels.
type Store struct {
	dir string
	log *slog.Logger
}

// NewStore returns the store in cacheDir (created on first build).
func NewStore(cacheDir string, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{dir: filepath.Join(cacheDir, "kernels"), log: logger}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// source describes the tarball to build from.
type source struct {
	path, pkgVersion, version string // version: "6.1" from the file name
	ident                     string // what the key hashes
}

var sourceName = regexp.MustCompile(`^linux-source-(\d+\.\d+)\.tar\.(xz|gz|bz2)$`)

// findSource picks the tarball to build: the given one, or the newest
// linux-source package installed.
func findSource(path string) (source, error) {
	if path == "" {
		cands, _ := filepath.Glob("/usr/src/linux-source-*.tar.*")
		var best string
		var bestVer []int
		for _, c := range cands {
			m := sourceName.FindStringSubmatch(filepath.Base(c))
			if m == nil {
				continue
			}
			v := versionInts(m[1])
			if best == "" || slices.Compare(v, bestVer) > 0 {
				best, bestVer = c, v
			}
		}
		if best == "" {
			return source{}, errors.New("no /usr/src/linux-source-*.tar.xz to build the guest kernel from; install it and the build tools with: " + InstallCommand)
		}
		path = best
	}
	fi, err := os.Stat(path)
	if err != nil {
		return source{}, fmt.Errorf("kernel source: %w", err)
	}
	src := source{path: path}
	if m := sourceName.FindStringSubmatch(filepath.Base(path)); m != nil {
		src.version = m[1]
		// The package version pins the exact source; dpkg knows it when the
		// tarball came from the package.
		if out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "linux-source-"+m[1]).Output(); err == nil {
			src.pkgVersion = strings.TrimSpace(string(out))
		}
	}
	if src.pkgVersion != "" && strings.HasPrefix(path, "/usr/src/") {
		src.ident = "debian linux-source " + src.pkgVersion
	} else {
		src.ident = fmt.Sprintf("tarball %s size %d mtime %d", filepath.Base(path), fi.Size(), fi.ModTime().Unix())
	}
	return src, nil
}

func versionInts(v string) []int {
	var out []int
	for _, p := range strings.Split(v, ".") {
		n, _ := strconv.Atoi(p)
		out = append(out, n)
	}
	return out
}

// key is the content key of a kernel built from src with the fragment.
func key(src source) string {
	h := sha256.New()
	fmt.Fprintf(h, "sandboxd kernel format %d\nsource %s\nlocalversion %s\nfragment\n", formatVersion, src.ident, LocalVersion)
	h.Write(Fragment)
	return hex.EncodeToString(h.Sum(nil))
}

// id names a kernel's directory. The release is not known before the
// build, so the directory is named after the source series.
func id(src source, key string) string {
	v := src.version
	if v == "" {
		v = "linux"
	}
	return v + LocalVersion + "-" + key[:12]
}

// Lookup returns the cached kernel for the installed source and the current
// fragment, or ErrNotBuilt.
func (s *Store) Lookup(sourcePath string) (*Kernel, error) {
	src, err := findSource(sourcePath)
	if err != nil {
		return nil, err
	}
	k, err := s.load(id(src, key(src)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotBuilt
	}
	return k, err
}

// List returns the kernels in the cache, newest first.
func (s *Store) List() ([]*Kernel, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list kernels: %w", err)
	}
	var out []*Kernel
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		k, err := s.load(e.Name())
		if err != nil {
			s.log.Warn("skipping unreadable kernel", "dir", e.Name(), "err", err)
			continue
		}
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

func (s *Store) load(id string) (*Kernel, error) {
	dir := filepath.Join(s.dir, id)
	b, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
	if err != nil {
		return nil, err
	}
	var k Kernel
	if err := json.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("parse %s/kernel.json: %w", id, err)
	}
	// The cache may have moved: paths follow the directory.
	k.Path = filepath.Join(dir, "vmlinux")
	k.Config = filepath.Join(dir, "config")
	k.BuildDuration = time.Duration(k.BuildSeconds * float64(time.Second))
	return &k, nil
}

// Ensure returns the cached kernel, building it when missing.
func (s *Store) Ensure(ctx context.Context, tracker progress.Tracker) (*Kernel, error) {
	return s.Build(ctx, BuildOptions{}, tracker)
}

// Build builds the kernel unless it is cached (or opts.Force). Progress goes
// to tracker (nil: nowhere), counted in kbuild's steps (CC, LD, AR, ...
// lines, as compilation dominates) against the last build's count.
func (s *Store) Build(ctx context.Context, opts BuildOptions, tracker progress.Tracker) (*Kernel, error) {
	src, err := findSource(opts.Source)
	if err != nil {
		return nil, err
	}
	k := key(src)
	kid := id(src, k)
	if !opts.Force {
		if got, err := s.load(kid); err == nil {
			return got, nil
		}
	}
	for _, tool := range []string{"make", "gcc", "tar", "bc", "bison", "flex", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("build kernel: %s not found; install the build tools with: %s", tool, InstallCommand)
		}
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("build kernel: %w", err)
	}
	unlock, err := flock.Lock(ctx, filepath.Join(s.dir, kid+".lock"), func() {
		s.log.Info("waiting for another build of the same kernel to finish", "lock", filepath.Join(s.dir, kid+".lock"))
	})
	if err != nil {
		return nil, fmt.Errorf("build kernel %s: %w", kid, err)
	}
	defer unlock()
	if !opts.Force {
		if got, err := s.load(kid); err == nil {
			return got, nil // another process built it while we waited
		}
	}
	// Leftovers of crashed builds of this key.
	if olds, _ := filepath.Glob(filepath.Join(s.dir, "."+kid+"-*")); len(olds) > 0 {
		for _, o := range olds {
			_ = os.RemoveAll(o)
		}
	}
	jobs := opts.Jobs
	if jobs <= 0 {
		jobs = runtime.NumCPU()
	}
	tmp, err := os.MkdirTemp(s.dir, "."+kid+"-")
	if err != nil {
		return nil, fmt.Errorf("build kernel %s: %w", kid, err)
	}
	defer os.RemoveAll(tmp)
	task := progress.Or(tracker).Start("building guest kernel "+kid, progress.Steps, int64(s.expectedSteps()))
	start := time.Now()
	got, steps, err := s.build(ctx, src, k, kid, tmp, jobs, task)
	task.Done(err)
	if err != nil {
		return nil, fmt.Errorf("build kernel %s: %w", kid, err)
	}
	got.BuildDuration = time.Since(start)
	got.BuildSeconds = got.BuildDuration.Seconds()
	if err := writeJSON(filepath.Join(tmp, "out", "kernel.json"), got); err != nil {
		return nil, fmt.Errorf("build kernel %s: %w", kid, err)
	}
	final := filepath.Join(s.dir, kid)
	if opts.Force {
		if err := os.RemoveAll(final); err != nil {
			return nil, fmt.Errorf("build kernel %s: replace: %w", kid, err)
		}
	}
	if err := os.Rename(filepath.Join(tmp, "out"), final); err != nil {
		return nil, fmt.Errorf("build kernel %s: %w", kid, err)
	}
	_ = os.WriteFile(filepath.Join(s.dir, ".steps"), []byte(strconv.Itoa(steps)), 0o644)
	s.log.Info("built guest kernel", "kernel", kid, "release", got.Release, "size_mib", got.Size>>20, "elapsed", got.BuildDuration.Round(time.Second), "jobs", jobs)
	return s.load(kid)
}

// expectedSteps is the number of build steps of the last build (for the
// progress bar's total), or an estimate for this fragment.
func (s *Store) expectedSteps() int {
	if b, err := os.ReadFile(filepath.Join(s.dir, ".steps")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return 1250
}

// build extracts, configures and compiles in tmp; the result is in tmp/out.
func (s *Store) build(ctx context.Context, src source, key, kid, tmp string, jobs int, task progress.Task) (*Kernel, int, error) {
	tree := filepath.Join(tmp, "src")
	out := filepath.Join(tmp, "out")
	for _, d := range []string{tree, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, 0, err
		}
	}
	task.Update(progress.State{Step: "extracting", Detail: filepath.Base(src.path)})
	if err := run(ctx, tmp, nil, "tar", "-xf", src.path, "-C", tree, "--strip-components=1"); err != nil {
		return nil, 0, fmt.Errorf("extract source: %w", err)
	}
	frag := filepath.Join(tmp, "sandboxd.config")
	if err := os.WriteFile(frag, Fragment, 0o644); err != nil {
		return nil, 0, err
	}
	task.Update(progress.State{Step: "configuring"})
	if err := run(ctx, tree, nil, "make", "allnoconfig", "KCONFIG_ALLCONFIG="+frag); err != nil {
		return nil, 0, fmt.Errorf("make allnoconfig: %w", err)
	}
	if err := run(ctx, tree, nil, "make", "olddefconfig"); err != nil {
		return nil, 0, fmt.Errorf("make olddefconfig: %w", err)
	}
	cfg, err := os.ReadFile(filepath.Join(tree, ".config"))
	if err != nil {
		return nil, 0, err
	}
	if missing := CheckConfig(Fragment, cfg); len(missing) > 0 {
		return nil, 0, fmt.Errorf("the fragment's options did not survive configuration (missing dependencies?): %s", strings.Join(missing, ", "))
	}
	task.Update(progress.State{Step: "compiling"})
	steps := 0
	err = run(ctx, tree, func(line string) {
		// Kbuild's quiet output: "  CC      kernel/fork.o".
		if f := strings.Fields(line); len(f) == 2 && f[0] == strings.ToUpper(f[0]) && len(f[0]) <= 9 {
			steps++
			task.Update(progress.State{Step: "compiling", Detail: f[1], Current: int64(steps)})
		}
	}, "make", "-j", strconv.Itoa(jobs), "vmlinux", "LOCALVERSION="+LocalVersion, "KBUILD_BUILD_USER=sandboxd", "KBUILD_BUILD_HOST=sandboxd")
	if err != nil {
		return nil, 0, fmt.Errorf("make vmlinux: %w", err)
	}
	release, err := os.ReadFile(filepath.Join(tree, "include", "config", "kernel.release"))
	if err != nil {
		return nil, 0, fmt.Errorf("read kernel release: %w", err)
	}
	if err := copyFile(filepath.Join(tree, "vmlinux"), filepath.Join(out, "vmlinux"), 0o644); err != nil {
		return nil, 0, err
	}
	if err := os.WriteFile(filepath.Join(out, "config"), cfg, 0o644); err != nil {
		return nil, 0, err
	}
	fi, err := os.Stat(filepath.Join(out, "vmlinux"))
	if err != nil {
		return nil, 0, err
	}
	return &Kernel{
		ID: kid, Key: key, Release: strings.TrimSpace(string(release)),
		Source: src.path, SourceVersion: src.pkgVersion,
		Size: fi.Size(), Jobs: jobs, CreatedAt: time.Now().UTC(),
	}, steps, nil
}

// CheckConfig lists the fragment's settings that the final config lacks.
// "CONFIG_X=n" and "# CONFIG_X is not set" both mean off.
func CheckConfig(fragment, config []byte) []string {
	want := parseConfig(fragment)
	have := parseConfig(config)
	var missing []string
	for k, v := range want {
		got, ok := have[k]
		if !ok {
			got = "n"
		}
		if got != v {
			missing = append(missing, fmt.Sprintf("%s=%s (got %s)", k, v, got))
		}
	}
	sort.Strings(missing)
	return missing
}

var notSet = regexp.MustCompile(`^# (CONFIG_\w+) is not set$`)

func parseConfig(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := notSet.FindStringSubmatch(line); m != nil {
			out[m[1]] = "n"
			continue
		}
		if !strings.HasPrefix(line, "CONFIG_") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		out[k] = v
	}
	return out
}

// run runs a build command in dir. Each output line goes to onLine when it
// is set; the last lines are kept for the error message.
func run(ctx context.Context, dir string, onLine func(string), name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	// Its own process group, so cancelling kills make's children too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	tail := make([]string, 0, 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if onLine != nil {
				onLine(line)
			}
			if len(tail) == cap(tail) {
				tail = tail[1:]
			}
			tail = append(tail, line)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.Join(tail, "\n"))
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	// Synced before the build directory holding it is renamed into place,
	// so a published kernel never has a torn kernel.json.
	return renameio.WriteFile(path, b, 0o644, renameio.WithTempDir(filepath.Dir(path)))
}
