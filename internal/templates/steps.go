package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// The default bounds of a build with steps.
const (
	DefaultStepTimeout  = 10 * time.Minute
	DefaultBuildTimeout = 30 * time.Minute
	// maxBuildSandboxes is how many build sandboxes this node runs at
	// once; the other builds' steps wait their turn (within their time).
	maxBuildSandboxes = 4
	// maxStepOutput is how much of one step's output goes to the build
	// log; the rest is counted and left out.
	maxStepOutput = 1 << 20
)

// BuildHost starts the sandboxes steps run in; package sandbox's Manager
// is one.
type BuildHost interface {
	// StartBuildSandbox starts a sandbox of req, isolated like any other
	// and with req.Network's policy, and returns it running; stop
	// destroys it and its network. It has no row: it is the build's.
	StartBuildSandbox(ctx context.Context, req BuildSandbox) (rsb runtime.Sandbox, stop func(context.Context), err error)
}

// BuildSandbox is a build sandbox to start.
type BuildSandbox struct {
	ID        string
	BaseDir   string // the base image's root filesystem
	BaseImage string
	// Layers are the layers of the steps before, bottom first.
	Layers  []runtime.Layer
	Network netpol.Policy
	// Env is added to every process's environment.
	Env []string
	// CPUs and MemoryBytes size it when not 0 (the build's request,
	// within Config's maximums); 0: the server's sandbox limits.
	CPUs        float64
	MemoryBytes int64
}

// definition is what a template with steps records to build them
// (store.Template.Definition): the steps, or the Dockerfile's text, which
// the build parses again with the base image's environment.
type definition struct {
	Dockerfile string `json:"dockerfile,omitempty"`
	// Context names the account's uploaded archive the Dockerfile's
	// COPY steps copy from (their FilesHash).
	Context  string              `json:"context,omitempty"`
	Steps    []templatespec.Step `json:"steps,omitempty"`
	StartCmd string              `json:"startCmd,omitempty"`
	ReadyCmd string              `json:"readyCmd,omitempty"`
	// Parent is the template built over (fromTemplate), as it was when
	// the build was asked for; nil: the base is the image (Source).
	Parent *parent `json:"parent,omitempty"`
	// Sandbox is the sandbox a template saved from one was captured from
	// (FromSandbox); "" otherwise.
	Sandbox string `json:"sandbox,omitempty"`
	// Tags are the tags the build takes when ready, its own first (E2B's
	// Template API: a build with several tags, or a rebuild of a name:tag
	// that takes the tag from the build before).
	Tags []string `json:"tags,omitempty"`
	// CPUs and MemoryMiB size the build sandboxes (0: the server's).
	CPUs      float64 `json:"cpus,omitempty"`
	MemoryMiB int64   `json:"memoryMiB,omitempty"`
}

// parseDefinition reads a template's definition ("" is none).
func parseDefinition(t store.Template) (definition, error) {
	var d definition
	if t.Definition == "" {
		return d, nil
	}
	if err := json.Unmarshal([]byte(t.Definition), &d); err != nil {
		return d, fmt.Errorf("template %s: its definition: %w", t.ID, err)
	}
	return d, nil
}

// stepsDocument is the steps JSON as templatespec.FromJSON reads it.
type stepsDocument struct {
	FromImage    string          `json:"fromImage,omitempty"`
	FromTemplate string          `json:"fromTemplate,omitempty"`
	Steps        json.RawMessage `json:"steps"`
}

// definition checks req's steps or Dockerfile and returns the base image
// and the definition to record ("" for none).
func (s *Service) definition(req BuildRequest) (image, def string, err error) {
	image = strings.TrimSpace(req.Image)
	lim := templatespec.DefaultLimits()
	for _, c := range []struct{ name, cmd string }{{"startCmd", req.StartCmd}, {"readyCmd", req.ReadyCmd}} {
		switch {
		case len(c.cmd) > lim.CommandBytes:
			return "", "", errdefs.Newf(errdefs.ErrInvalid, "%s: %d bytes, the limit is %d", c.name, len(c.cmd), lim.CommandBytes)
		case strings.IndexByte(c.cmd, 0) >= 0:
			return "", "", errdefs.Newf(errdefs.ErrInvalid, "%s: contains NUL", c.name)
		case c.cmd != "" && strings.TrimSpace(c.cmd) == "":
			return "", "", errdefs.Newf(errdefs.ErrInvalid, "%s: empty", c.name)
		}
	}
	d := definition{StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd}
	if req.Context != "" {
		if req.Dockerfile == "" {
			return "", "", errdefs.New(errdefs.ErrInvalid, "context: only with a dockerfile (steps name their files in filesHash)")
		}
		if err := CheckFilesHash(req.Context); err != nil {
			return "", "", fmt.Errorf("context: %w", err)
		}
	}
	switch {
	case req.Dockerfile != "" && len(req.Steps) > 0:
		return "", "", errdefs.New(errdefs.ErrInvalid, "dockerfile and steps: give one, not both")
	case req.Dockerfile != "":
		if image != "" {
			return "", "", errdefs.New(errdefs.ErrInvalid, "image: must be absent with a dockerfile (its FROM is the image)")
		}
		t, err := templatespec.ParseDockerfile([]byte(req.Dockerfile), templatespec.ParseOptions{})
		if err != nil {
			return "", "", fmt.Errorf("dockerfile: %w", err)
		}
		if t.Base.Kind != templatespec.BaseImage {
			return "", "", errdefs.New(errdefs.ErrInvalid, "dockerfile: FROM must name an image")
		}
		image = t.Base.Ref
		for _, st := range t.Steps {
			if st.Kind == templatespec.StepCopy && req.Context == "" {
				return "", "", errdefs.Newf(errdefs.ErrInvalid, "dockerfile: line %d (COPY): COPY needs a build context: upload it (PUT /api/templates/files/{sha256}) and name it in \"context\"", st.Line)
			}
		}
		d.Dockerfile, d.Context = req.Dockerfile, req.Context
	case len(req.Steps) > 0:
		if image == "" && req.FromTemplate == "" {
			return "", "", errdefs.New(errdefs.ErrInvalid, "image: required (the base the steps start from)")
		}
		doc, err := json.Marshal(stepsDocument{FromImage: image, FromTemplate: req.FromTemplate, Steps: req.Steps})
		if err != nil {
			return "", "", errdefs.Wrap(errdefs.ErrInvalid, err, "steps: not a JSON array")
		}
		t, err := templatespec.FromJSON(doc, templatespec.Limits{})
		if err != nil {
			return "", "", err
		}
		d.Steps = t.Steps
	}
	if d.Dockerfile == "" && len(d.Steps) == 0 && d.StartCmd == "" && d.ReadyCmd == "" {
		return image, "", nil
	}
	b, err := json.Marshal(d)
	return image, string(b), err
}

// canBuildSteps refuses a template with steps on a server that cannot
// run them.
func (s *Service) canBuildSteps() error {
	if s.host == nil || s.cfg.Blobs == nil {
		return errdefs.New(errdefs.ErrInvalid, "this server cannot run build steps (no sandbox runtime or blob store)")
	}
	return nil
}

// stepRun is one build's walk through its steps.
type stepRun struct {
	s    *Service
	t    store.Template
	base base
	logf func(string, ...any)
	// The build state: the ENV of the template, the ARGs of the build,
	// the current directory and user.
	env, args []string
	workdir   string
	user      string
	// layers is the chain so far (blob keys); dirs are the WORKDIRs made
	// since the last layer, to make in the next build sandbox.
	layers []string
	dirs   []string
	// size is the build sandboxes' (definition's CPUs and MemoryMiB).
	size definition
	// uploads are the blobs of the COPY steps' files, by their hash
	// (resolveUploads).
	uploads map[string]string
}

// runSteps runs t's steps (def) over b, reusing the layers its
// account's cache holds for the same keys, and returns the template's
// config (the base's, with the steps' ENV, WORKDIR and USER) and its
// layer chain (the base's, then the steps').
func (s *Service) runSteps(ctx context.Context, t store.Template, def definition, b base, logf func(string, ...any)) (oci.Config, []string, error) {
	steps := def.Steps
	cfg := b.config
	if def.Dockerfile != "" {
		tpl, err := templatespec.ParseDockerfile([]byte(def.Dockerfile), templatespec.ParseOptions{BaseEnv: envMap(cfg.Env)})
		if err != nil {
			return oci.Config{}, nil, err
		}
		steps = tpl.Steps
		for i := range steps {
			if steps[i].Kind == templatespec.StepCopy {
				steps[i].FilesHash = def.Context
			}
		}
		if tpl.StartCmd != "" {
			// Recorded like an image's CMD, not run (start commands
			// are not built yet).
			cfg.Entrypoint, cfg.Cmd = nil, []string{"/bin/sh", "-c", tpl.StartCmd}
		}
	}
	finalize := def.StartCmd != "" || def.ReadyCmd != ""
	if def.Parent != nil && len(steps) == 0 && def.StartCmd == def.Parent.StartCmd && def.ReadyCmd == def.Parent.ReadyCmd {
		// The parent's commands over the parent's files: checked when
		// the parent was built.
		finalize = false
	}
	if len(steps) == 0 && !finalize {
		return cfg, b.layers, nil
	}
	if err := s.canBuildSteps(); err != nil {
		return oci.Config{}, nil, err
	}
	ownerDefaults(steps, cfg.User)
	uploads, keySteps, err := s.resolveUploads(ctx, t.AccountID, steps)
	if err != nil {
		return oci.Config{}, nil, err
	}
	keys, err := templatespec.CacheKeys(b.key, keySteps)
	if err != nil {
		return oci.Config{}, nil, err
	}
	r := &stepRun{s: s, t: t, base: b, logf: logf, layers: slices.Clone(b.layers), uploads: uploads,
		env: append([]string(nil), cfg.Env...), workdir: cfg.WorkingDir, user: cfg.User,
		size: definition{CPUs: def.CPUs, MemoryMiB: def.MemoryMiB}}
	if r.workdir == "" {
		r.workdir = "/"
	}
	cached := true
	for i, st := range steps {
		n := i + 1
		if st.Force {
			cached = false
		}
		switch st.Kind {
		case templatespec.StepEnv, templatespec.StepArg:
			var names []string
			for _, e := range st.Env {
				if st.Kind == templatespec.StepEnv {
					r.env = setEnv(r.env, e.Name, e.Value)
				} else {
					r.args = setEnv(r.args, e.Name, e.Value)
				}
				names = append(names, e.Name)
			}
			logf("step %d/%d: %s %s", n, len(steps), st.Kind, strings.Join(names, " "))
		case templatespec.StepUser:
			r.user = st.User
			logf("step %d/%d: USER %s", n, len(steps), st.User)
		case templatespec.StepWorkdir:
			p := st.Path
			if !path.IsAbs(p) {
				p = path.Join(r.workdir, p)
			}
			r.workdir = path.Clean(p)
			r.dirs = append(r.dirs, r.workdir)
			logf("step %d/%d: WORKDIR %s", n, len(steps), r.workdir)
		case templatespec.StepRun:
			logf("step %d/%d: RUN %s", n, len(steps), clipLine(st.Command))
		case templatespec.StepCopy:
			logf("step %d/%d: COPY %s %s (files %s, owner %s)", n, len(steps), clipLine(st.Src), clipLine(st.Dest), short(st.FilesHash), st.User)
		default:
			return oci.Config{}, nil, errdefs.Newf(errdefs.ErrInvalid, "step %d (%s): not a step a build runs", n, st.Kind)
		}
		// A layer after each RUN and COPY, and after the last step when
		// WORKDIRs made directories no RUN or COPY took into its layer.
		if st.Kind != templatespec.StepRun && st.Kind != templatespec.StepCopy && (i < len(steps)-1 || len(r.dirs) == 0) {
			continue
		}
		if cached {
			l, err := s.st.UseTemplateLayer(ctx, t.AccountID, keys[i])
			if err == nil {
				if _, err = s.cfg.Blobs.Stat(ctx, l.BlobKey); err == nil {
					logf("step %d/%d: cached (layer %s)", n, len(steps), short(l.BlobKey))
					r.layers, r.dirs = append(r.layers, l.BlobKey), nil
					continue
				}
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, blob.ErrNotFound) {
				return oci.Config{}, nil, err
			}
			cached = false
		}
		key, size, err := r.layer(ctx, n, st)
		if err != nil {
			return oci.Config{}, nil, err
		}
		if err := s.st.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: t.AccountID, CacheKey: keys[i], BlobKey: key, Size: size}); err != nil {
			return oci.Config{}, nil, err
		}
		logf("step %d/%d: layer %s, %d bytes", n, len(steps), short(key), size)
		r.layers, r.dirs = append(r.layers, key), nil
	}
	cfg.Env, cfg.WorkingDir, cfg.User = r.env, r.workdir, r.user
	if cfg.WorkingDir == "/" && b.config.WorkingDir == "" {
		cfg.WorkingDir = ""
	}
	if finalize {
		if err := r.finalize(ctx, def, cfg); err != nil {
			return oci.Config{}, nil, err
		}
	}
	return cfg, r.layers, nil
}

// finalize checks the start and ready commands in a build sandbox of
// the finished template, as a sandbox from it will run them (StartCommand):
// the build fails when they do not get ready. Nothing of it is kept: no
// memory snapshot yet, so every sandbox from the template runs them
// again when it starts.
func (r *stepRun) finalize(ctx context.Context, def definition, cfg oci.Config) error {
	s := r.s
	select {
	case s.building <- struct{}{}:
		defer func() { <-s.building }()
	case <-ctx.Done():
		return ctx.Err()
	}
	layers, release, err := openLayers(ctx, s.cfg.Blobs, r.layers)
	if err != nil {
		return err
	}
	rsb, stop, err := s.host.StartBuildSandbox(ctx, BuildSandbox{ID: store.NewID("bld_"), BaseDir: r.base.dir,
		BaseImage: r.base.image, Layers: layers, Network: s.cfg.BuildNetwork, Env: cfg.Env,
		CPUs: def.CPUs, MemoryBytes: def.MemoryMiB << 20})
	release()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Wrap(nil, err, "finalize: the build sandbox could not start: "+errdefs.Message(err, "an error on the server"))
	}
	defer stop(context.WithoutCancel(ctx))
	r.logf("finalize: start command %q, ready command %q", clipLine(def.StartCmd), clipLine(def.ReadyCmd))
	start := time.Now()
	out := &logWriter{logf: r.logf, left: maxStepOutput}
	err = StartCommand(ctx, rsb, def.StartCmd, def.ReadyCmd, cfg.WorkingDir, userName(cfg.User), s.cfg.StepTimeout, out)
	out.flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Wrap(nil, err, "finalize: "+errdefs.Message(err, "the start command could not run"))
	}
	r.logf("finalize: ready after %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// StartCommand starts start (when not "") in rsb, detached so that it
// keeps running, and runs ready (when not "") until it exits 0, every
// 200 ms, for at most within. Both run by /bin/sh in cwd as user; start's
// output goes to out (nil: dropped) until ready. The error, for the
// user, says which failed: the start command ended, the ready command
// never passed.
func StartCommand(ctx context.Context, rsb runtime.Sandbox, start, ready, cwd, user string, within time.Duration, out io.Writer) error {
	if out == nil {
		out = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	type result struct {
		res runtime.ExecResult
		err error
	}
	ended := make(chan result, 1)
	if start != "" {
		started := make(chan struct{})
		var once sync.Once
		sctx, stopFollowing := context.WithCancel(context.WithoutCancel(ctx))
		defer stopFollowing() // the process runs on (Detach)
		go func() {
			res, err := rsb.Exec(sctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", start}, Cwd: cwd, User: user,
				Stdout: out, Stderr: out, Tag: "template-start", Detach: true,
				Started: func(int) { once.Do(func() { close(started) }) }})
			once.Do(func() { close(started) })
			ended <- result{res, err}
		}()
		select {
		case <-started:
		case <-ctx.Done():
			return errdefs.Newf(nil, "the start command did not start within %s", within)
		}
	}
	check := func() (bool, error) {
		select {
		case r := <-ended:
			// Exit 0 is a start command that left a daemon behind.
			if r.err != nil && !errors.Is(r.err, context.Canceled) {
				return false, errdefs.Wrap(nil, r.err, "the start command could not run: "+errdefs.Message(r.err, "an error on the server"))
			}
			if r.err == nil && r.res.ExitCode != 0 {
				return false, errdefs.Newf(nil, "the start command ended with exit code %d before the template was ready", r.res.ExitCode)
			}
		default:
		}
		if ready == "" {
			return true, nil
		}
		res, err := rsb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", ready}, Cwd: cwd, User: user, Timeout: 10 * time.Second})
		return err == nil && res.ExitCode == 0, nil
	}
	for {
		ok, err := check()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errdefs.Newf(nil, "the ready command did not pass within %s", within)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// layer starts a build sandbox over the chain so far, makes the pending
// WORKDIRs, runs st when it is a RUN, and stores what changed as a layer.
func (r *stepRun) layer(ctx context.Context, n int, st templatespec.Step) (key string, size int64, err error) {
	s := r.s
	select {
	case s.building <- struct{}{}:
		defer func() { <-s.building }()
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
	layers, release, err := openLayers(ctx, s.cfg.Blobs, r.layers)
	if err != nil {
		return "", 0, err
	}
	rsb, stop, err := s.host.StartBuildSandbox(ctx, BuildSandbox{ID: store.NewID("bld_"), BaseDir: r.base.dir,
		BaseImage: r.base.image, Layers: layers, Network: s.cfg.BuildNetwork,
		CPUs: r.size.CPUs, MemoryBytes: r.size.MemoryMiB << 20})
	release()
	if err != nil {
		if ctx.Err() != nil {
			return "", 0, ctx.Err()
		}
		return "", 0, errdefs.Wrap(nil, err, fmt.Sprintf("step %d (%s): the build sandbox could not start: %s", n, st.Kind, errdefs.Message(err, "an error on the server")))
	}
	defer stop(context.WithoutCancel(ctx))
	if len(r.dirs) > 0 {
		var out strings.Builder
		res, err := rsb.Exec(ctx, runtime.ExecRequest{Cmd: append([]string{"mkdir", "-p", "--"}, r.dirs...), Cwd: "/", Stdout: &out, Stderr: &out, Timeout: s.cfg.StepTimeout})
		if err == nil && res.ExitCode != 0 {
			err = errors.New(strings.TrimSpace(out.String()))
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", 0, ctx.Err()
			}
			return "", 0, errdefs.Wrap(nil, err, fmt.Sprintf("step %d: WORKDIR %s could not be made", n, strings.Join(r.dirs, " ")))
		}
	}
	switch st.Kind {
	case templatespec.StepRun:
		if err := r.run(ctx, rsb, n, st); err != nil {
			return "", 0, err
		}
	case templatespec.StepCopy:
		if err := r.copyFiles(ctx, rsb, n, st); err != nil {
			return "", 0, err
		}
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := rsb.Snapshot(ctx, pw)
		pw.CloseWithError(err)
	}()
	info, err := s.cfg.Blobs.Put(ctx, pr)
	pr.CloseWithError(err)
	if err != nil {
		if ctx.Err() != nil {
			return "", 0, ctx.Err()
		}
		return "", 0, errdefs.Wrap(nil, err, fmt.Sprintf("step %d (%s): its layer could not be stored", n, st.Kind))
	}
	return info.Key, info.Size, nil
}

// run runs a RUN step: sh -c as the step's user (else the current one),
// in the current directory, with the ENV and ARG values so far, its
// output to the build log as it comes.
func (r *stepRun) run(ctx context.Context, rsb runtime.Sandbox, n int, st templatespec.Step) error {
	user := st.User
	if user == "" {
		user = r.user
	}
	env := append([]string(nil), r.args...)
	for _, kv := range r.env {
		name, value, _ := strings.Cut(kv, "=")
		env = setEnv(env, name, value)
	}
	out := &logWriter{logf: r.logf, left: maxStepOutput}
	res, err := rsb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", st.Command}, Env: env, Cwd: r.workdir,
		User: userName(user), Stdout: out, Stderr: out, Timeout: r.s.cfg.StepTimeout})
	out.flush()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, runtime.ErrCommandNotFound):
		return errdefs.Wrap(nil, err, fmt.Sprintf("step %d (RUN): the image has no /bin/sh", n))
	case err != nil:
		return errdefs.Wrap(nil, err, fmt.Sprintf("step %d (RUN): could not run: %s", n, errdefs.Message(err, "an error on the server")))
	case res.TimedOut:
		return errdefs.Newf(nil, "step %d (RUN) took longer than %s", n, r.s.cfg.StepTimeout)
	case res.ExitCode != 0:
		return errdefs.Newf(nil, "step %d (RUN %s) failed with exit code %d", n, clipLine(st.Command), res.ExitCode)
	}
	return nil
}

// openLayers opens the blobs of keys as runtime layers, bottom first.
func openLayers(ctx context.Context, blobs blob.Store, keys []string) ([]runtime.Layer, func(), error) {
	var opened []io.Closer
	release := func() {
		for _, c := range opened {
			c.Close()
		}
	}
	if len(keys) > 0 && blobs == nil {
		return nil, func() {}, errdefs.New(errdefs.ErrConflict, "the template has layers and this server has no blob store for them")
	}
	layers := make([]runtime.Layer, 0, len(keys))
	for _, k := range keys {
		rc, err := blobs.Get(ctx, k)
		if err != nil {
			release()
			return nil, func() {}, errdefs.Wrap(errdefs.ErrConflict, err, fmt.Sprintf("a layer of the template (%s) is missing", short(k)))
		}
		opened = append(opened, rc)
		layers = append(layers, runtime.Layer{ID: "sha256:" + k, R: rc})
	}
	return layers, release, nil
}

// logWriter passes a step's output to the build log line by line, as it
// comes, at most left bytes of it.
type logWriter struct {
	logf    func(string, ...any)
	buf     []byte
	left    int
	dropped int
}

func (w *logWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.left <= 0 {
		w.dropped += n
		return n, nil
	}
	if len(p) > w.left {
		w.dropped += len(p) - w.left
		p = p[:w.left]
	}
	w.left -= len(p)
	w.buf = append(w.buf, p...)
	if i := strings.LastIndexByte(string(w.buf), '\n'); i >= 0 {
		// One write of the log for what came at once; every line
		// stamped.
		lines := strings.Split(strings.ReplaceAll(string(w.buf[:i]), "\r\n", "\n"), "\n")
		w.logf("%s", strings.Join(lines, "\n"+stamp()))
		w.buf = w.buf[i+1:]
	}
	return n, nil
}

// stamp is logLine's prefix of a line.
func stamp() string { return time.Now().UTC().Format(time.RFC3339) + " " }

func (w *logWriter) flush() {
	if len(w.buf) > 0 {
		w.logf("%s", string(w.buf))
		w.buf = nil
	}
	if w.dropped > 0 {
		w.logf("(%d more bytes of output left out of the log)", w.dropped)
	}
}

// setEnv sets name=value in env, replacing an earlier value.
func setEnv(env []string, name, value string) []string {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			env[i] = name + "=" + value
			return env
		}
	}
	return append(env, name+"="+value)
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// userName is the user part of "name[:group]": commands run as a name
// in the image's /etc/passwd ("root" is the agent's own).
func userName(user string) string {
	name, _, _ := strings.Cut(user, ":")
	if name == "root" || name == "0" {
		return ""
	}
	return name
}

func short(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

// clipLine is a command as a log line shows it: its first line, at most
// 200 bytes.
func clipLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
