package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// What a runsc binary can save, found by trial. A pause and a fork rest on
// `runsc checkpoint` and `runsc restore`, which differ between gVisor
// versions in ways that destroy the sandbox when they go wrong: Debian's
// runsc of December 2022 saves a paused container with --leave-running
// and then panics ("invalid state transition: paused => stopped"), the
// container gone. So before the first save of a sandbox of a runsc
// binary, a throwaway container of that binary is saved and restored the
// ways pause and fork do it, and what worked decides: a runsc that cannot
// save at all has its pauses and forks refused before anything is
// touched, and one whose --leave-running loses the container forks by
// saving its parent as a pause does and restoring it. The answer is kept
// per binary (version, size, modification time), platform and kernel, in
// the state dir as the platform trials are, so it costs about a second
// once (a runsc that could not save at all is tried again at each start).

// saveSupport is what checkpoint and restore of one runsc binary do here.
type saveSupport struct {
	// Unsupported, when not empty, is why its sandboxes cannot be saved
	// at all: the trial container's checkpoint or restore failed.
	Unsupported string `json:"unsupported,omitempty"`
	// LeaveRunning: `checkpoint --leave-running` of a paused container
	// saves it and leaves it there, as a fork wants (a current runsc).
	LeaveRunning bool `json:"leave_running"`
	// LeaveRunningErr is what that trial did instead.
	LeaveRunningErr string `json:"leave_running_err,omitempty"`
}

// saveProbes holds the trials' answers of this process, by binary, and
// the trial of the runtime's own runsc started with it.
type saveProbes struct {
	mu    sync.Mutex
	found map[string]saveSupport

	cancel context.CancelFunc // ends the trial started ahead
	ahead  sync.WaitGroup
}

// trySavesAhead starts the save trial of the runsc new sandboxes run on
// in the background, so that the first pause or fork need not wait for
// it (it does when it comes first).
func (r *Runtime) trySavesAhead() {
	ctx, cancel := context.WithCancel(r.Context())
	r.saves.cancel = cancel
	r.saves.ahead.Go(func() {
		if _, err := r.saveSupportOf(ctx, meta{Runsc: r.runsc.Path, Platform: r.platform}); err != nil && ctx.Err() == nil {
			r.log.Warn("gVisor save trial", "runsc", r.runsc.Path, "err", err)
		}
	})
}

// stopAhead ends the trial started ahead and waits for it.
func (p *saveProbes) stopAhead() {
	if p.cancel != nil {
		p.cancel()
	}
	p.ahead.Wait()
}

// saveTrialTimeout bounds each runsc command of a save trial, and the
// wait for its container to start: a container holding one idle process
// starts, saves and restores in well under a second.
const saveTrialTimeout = 30 * time.Second

// saveSupportOf says what the runsc that made the sandbox m describes can
// save, trying it the first time it is asked about that binary. An error
// is the trial's own failure (it could not be run), not an answer.
func (r *Runtime) saveSupportOf(ctx context.Context, m meta) (saveSupport, error) {
	path, platform := r.runscOf(m)
	r.saves.mu.Lock()
	defer r.saves.mu.Unlock() // one trial at a time: the others want its answer
	key, err := r.saveProbeKey(ctx, path, platform)
	if err != nil {
		return saveSupport{}, err
	}
	if s, ok := r.saves.found[key]; ok {
		return s, nil
	}
	cachePath := filepath.Join(r.StateDir(), "save-probe-"+key+".json")
	var s saveSupport
	if b, err := os.ReadFile(cachePath); err == nil && json.Unmarshal(b, &s) == nil {
		r.rememberSave(key, s)
		return s, nil
	}
	start := time.Now()
	s, err = r.saveTrial(ctx, path, platform)
	if err != nil {
		return saveSupport{}, fmt.Errorf("try what %s can save: %w", path, err)
	}
	r.log.Info("gVisor save trial", "runsc", path, "platform", platform, "unsupported", s.Unsupported,
		"leave_running", s.LeaveRunning, "leave_running_err", s.LeaveRunningErr, "elapsed", time.Since(start).Round(time.Millisecond))
	// A runsc that could not save is tried again at the next start: the
	// failure may have been the host's (its disk, its memory) rather than
	// the binary's.
	if b, err := json.Marshal(s); err == nil && s.Unsupported == "" {
		_ = os.WriteFile(cachePath, b, 0o600)
	}
	r.rememberSave(key, s)
	return s, nil
}

// rememberSave keeps a trial's answer for this process; callers hold
// r.saves.mu.
func (r *Runtime) rememberSave(key string, s saveSupport) {
	if r.saves.found == nil {
		r.saves.found = map[string]saveSupport{}
	}
	r.saves.found[key] = s
}

// saveProbeKey names the runsc binary at path on platform for the save
// trials' cache: its version, size and modification time, and the kernel.
func (r *Runtime) saveProbeKey(ctx context.Context, path, platform string) (string, error) {
	version := r.runsc.Version
	if path != r.runsc.Path {
		v, err := runscVersion(ctx, path)
		if err != nil {
			return "", err
		}
		version = v
	}
	key := "save-1\x00" + version + "\x00" + platform + "\x00" + kernelRelease()
	if fi, err := os.Stat(path); err == nil {
		key += fmt.Sprintf("\x00%d\x00%d", fi.Size(), fi.ModTime().UnixNano())
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8]), nil
}

// runscOf is the runsc binary and platform that made the sandbox m
// describes (see runscFor).
func (r *Runtime) runscOf(m meta) (path, platform string) {
	path, platform = m.Runsc, m.Platform
	if path == "" {
		path = r.legacyRunsc
	}
	if platform == "" {
		platform = r.platform
	}
	return path, platform
}

// saveTrial starts a throwaway container of the runsc at path that holds
// one idle process, saves and restores it as a pause and a resume do, then
// saves it as a fork does (paused, with --leave-running) and resumes it.
//
// ctx ends the trial between its steps, never in the middle of a runsc
// command: a runsc killed while it starts or restores a container leaves
// processes and mounts that nothing would clean up.
func (r *Runtime) saveTrial(ctx context.Context, path, platform string) (saveSupport, error) {
	t, err := r.newTrialContainer(path, platform, []string{"/sandbox-agent", "version", "--wait"})
	if err != nil {
		return saveSupport{}, err
	}
	defer t.remove()
	if err := t.start(ctx); err != nil {
		return saveSupport{}, err
	}
	var s saveSupport
	if err := ctx.Err(); err != nil {
		return s, err
	}
	if err := t.saveAndRestore(); err != nil {
		s.Unsupported = err.Error()
		return s, nil
	}
	if err := ctx.Err(); err != nil {
		return s, err
	}
	if err := t.saveLeavingRunning(); err != nil {
		s.LeaveRunningErr = err.Error()
		return s, nil
	}
	s.LeaveRunning = true
	return s, nil
}

// trialContainer is a throwaway container in a directory of its own (its
// runsc root, bundle and root filesystem: the agent binary alone).
type trialContainer struct {
	runsc, platform, dir, cid string
}

func (r *Runtime) newTrialContainer(path, platform string, args []string) (*trialContainer, error) {
	dir, err := newTrialDir(r.StateDir())
	if err != nil {
		return nil, err
	}
	t := &trialContainer{runsc: path, platform: platform, dir: dir, cid: "probe-save-" + host.NewCID("")}
	if err := t.prepare(filepath.Join(r.StateDir(), "bin", "sandbox-agent"), args); err != nil {
		endTrial(path, dir, "")
		return nil, err
	}
	return t, nil
}

// prepare writes the bundle: the agent at /sandbox-agent running args.
func (t *trialContainer) prepare(agentPath string, args []string) error {
	rootfs := filepath.Join(t.dir, "rootfs")
	for _, d := range []string{filepath.Join(t.dir, "runsc"), rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "sandbox-agent"), agent, 0o755); err != nil {
		return err
	}
	return writeSpec(t.dir, &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/"}},
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux:   &specs.Linux{Namespaces: namespaces(), CgroupsPath: trialCgroup(t.dir)},
	})
}

// run runs a runsc command on the trial's root and returns what it
// printed. Its output goes to a file: a detached container inherits it
// and would hold a pipe open.
func (t *trialContainer) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), saveTrialTimeout)
	defer cancel()
	global := []string{"--root", filepath.Join(t.dir, "runsc"), "--platform", t.platform, "--network", "none", "--overlay2", "none"}
	out, err := os.OpenFile(filepath.Join(t.dir, "out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", err
	}
	defer out.Close()
	from, _ := out.Seek(0, 2)
	cmd := exec.CommandContext(ctx, t.runsc, append(global, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	b, _ := os.ReadFile(filepath.Join(t.dir, "out"))
	text := ""
	if int64(len(b)) > from {
		text = string(b[from:])
	}
	if err != nil {
		return text, fmt.Errorf("runsc %s: %w: %s", args[0], err, runscMessage(text))
	}
	return text, nil
}

// runscMessage is what a failed runsc said: its panic's line when it
// panicked (the last line is then a stack frame), else its last line.
func runscMessage(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "panic: ") {
			return line
		}
	}
	return host.LastLine(out)
}

// start runs the container and waits until its process printed (or ctx
// ends).
func (t *trialContainer) start(ctx context.Context) error {
	if _, err := t.run("run", "--bundle", t.dir, "--detach", t.cid); err != nil {
		return err
	}
	deadline := time.After(saveTrialTimeout)
	for {
		b, _ := os.ReadFile(filepath.Join(t.dir, "out"))
		if strings.Contains(string(b), "sandbox-agent") {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("the trial container printed nothing within %v", saveTrialTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// status is what runsc says of the container ("running", "paused",
// "stopped"; "" once it knows none).
func (t *trialContainer) status() string {
	out, err := t.run("state", t.cid)
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	if i := strings.IndexByte(out, '{'); i >= 0 {
		_ = json.Unmarshal([]byte(out[i:]), &st)
	}
	return st.Status
}

// saveAndRestore does what a pause and a resume do (pause.go): checkpoint,
// which ends the container, then delete and restore under the same id.
func (t *trialContainer) saveAndRestore() error {
	img := filepath.Join(t.dir, "pause-image")
	if err := os.Mkdir(img, 0o700); err != nil {
		return err
	}
	if _, err := t.run("checkpoint", "--image-path", img, t.cid); err != nil {
		return err
	}
	if _, err := t.run("delete", "--force", t.cid); err != nil && !notFound(err) {
		return err
	}
	if _, err := t.run("restore", "--image-path", img, "--bundle", t.dir, "--detach", t.cid); err != nil {
		return err
	}
	if st := t.status(); st != "running" {
		return fmt.Errorf("restored container is %q, not running", st)
	}
	return nil
}

// saveLeavingRunning does what a fork does to its parent (fork.go): pause,
// checkpoint --leave-running, resume; the container must run on.
func (t *trialContainer) saveLeavingRunning() error {
	img := filepath.Join(t.dir, "fork-image")
	if err := os.Mkdir(img, 0o700); err != nil {
		return err
	}
	if _, err := t.run("pause", t.cid); err != nil {
		return err
	}
	_, err := t.run("checkpoint", "--leave-running", "--image-path", img, t.cid)
	if _, rerr := t.run("resume", t.cid); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return err
	}
	if st := t.status(); st != "running" {
		return fmt.Errorf("after checkpoint --leave-running the container is %q, not running", st)
	}
	return nil
}

// remove deletes the container, ends what of it still runs, and removes
// its directory (endTrial).
func (t *trialContainer) remove() { endTrial(t.runsc, t.dir, t.cid) }

// removeTrialDirs ends what trials (platform.go, saveprobe.go) of a
// process that died during them left: the sandbox and gofer still running
// in their cgroups (a detached save trial's would run for minutes), the
// groups, and their directories with the null-netns mount a current runsc
// puts in its root.
func removeTrialDirs(stateDir string) {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, "probe-*"))
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		endTrial("", d, "")
	}
}

// savable is saveSupportOf for a save about to be made: what the
// sandbox's runsc can do, or, when it cannot save at all, the refusal
// (cannotSave) with nothing touched.
func (r *Runtime) savable(ctx context.Context, m meta) (saveSupport, error) {
	sup, err := r.saveSupportOf(ctx, m)
	if err != nil {
		return sup, err
	}
	if sup.Unsupported != "" {
		return sup, r.cannotSave(ctx, m, sup)
	}
	return sup, nil
}

// cannotSave is the refusal of a save (pause, fork) on a runsc whose
// trial could not save: ErrCannotPause, with the runsc's version (never a
// host path: users read it) and what would help.
func (r *Runtime) cannotSave(ctx context.Context, m meta, s saveSupport) error {
	path, _ := r.runscOf(m)
	version := r.runsc.Version
	if path != r.runsc.Path {
		version, _ = runscVersion(ctx, path)
	}
	r.log.Warn("save refused: the runsc cannot save sandboxes", "id", m.ID, "runsc", path, "why", s.Unsupported)
	return fmt.Errorf("%w: the gVisor this sandbox runs on (runsc %s) failed to save and restore a trial sandbox on this host; sandboxes started on a current gVisor can be saved (scripts/install-runsc.sh installs it, sandboxd uses it once restarted)",
		runtime.ErrCannotPause, version)
}
