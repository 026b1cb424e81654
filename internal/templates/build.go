package templates

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
)

// buildWorker works build-template jobs.
type buildWorker struct {
	river.WorkerDefaults[jobs.BuildTemplateArgs]
	s *Service
}

// Work builds the template the job names. A build that fails for the
// user's reason (the image, the registry) marks the row failed and ends
// the job; one cut by a stop of the server returns the error, so the
// job runs again when the server is back.
func (w *buildWorker) Work(ctx context.Context, job *river.Job[jobs.BuildTemplateArgs]) error {
	return w.s.Run(ctx, job.Args.TemplateID)
}

// Run builds template id when its row is still building: resolves its
// image, fetches it into the cache unless its digest is there, and marks
// the row ready, or failed with a reason for its user. A context that
// ends first leaves the row building and returns the context's error.
func (s *Service) Run(ctx context.Context, id string) error {
	t, err := s.st.GetTemplate(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // deleted before its build ran
	}
	if err != nil {
		return err
	}
	if t.Status != store.TemplateBuilding || t.Waiting() {
		return nil // built already (a job run again after a restart), or not started
	}
	logf := func(format string, a ...any) {
		if err := s.st.AppendTemplateLog(context.WithoutCancel(ctx), id, logLine(format, a...)); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("templates: write a build log", "template_id", id, "err", err)
		}
	}
	def, err := parseDefinition(t)
	if err != nil {
		return err
	}
	if def.Sandbox != "" {
		// Saved from a sandbox by a request (FromSandbox) that a stop
		// of the server cut: the sandbox's files are not to be had
		// again as they were.
		logf("saving the sandbox was interrupted; save it again")
		_, err := s.st.FinishTemplate(context.WithoutCancel(ctx), id, store.TemplateFailed, "", "", "the server stopped while the sandbox was being saved; delete this template and save the sandbox again")
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, s.cfg.BuildTimeout)
	defer cancel()
	var b base
	if def.Parent != nil {
		b, err = s.parentBase(bctx, t, *def.Parent, logf)
	} else {
		var creds oci.Credentials
		if creds, err = s.credentials(ctx, id); err == nil {
			b, err = s.imageBase(bctx, t, creds, logf)
		}
	}
	var layers []string
	cfg := b.config
	if err == nil && t.Definition != "" {
		cfg, layers, err = s.runSteps(bctx, t, def, b, logf)
	}
	if err == nil && !isBuiltin(b.digest) {
		// Ready only once every node can start it (the built-in image
		// is every node's own).
		err = s.distribute(bctx, b.digest, logf)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = errdefs.Wrap(nil, err, fmt.Sprintf("the build took longer than %s", s.cfg.BuildTimeout))
	}
	if err != nil {
		if ctx.Err() != nil {
			logf("build interrupted; it starts again when the server does")
			return err
		}
		reason := errdefs.Message(err, "the image could not be fetched")
		if b.digest != "" {
			reason = errdefs.Message(err, "the build failed on the server")
		}
		s.log.Info("templates: build failed", "template_id", id, "source", t.Source, "err", err)
		logf("build failed: %s", reason)
		// The digest stays named (the cached image is kept for the next
		// attempt, and a child's parent's image while the child exists)
		// until the failed template is deleted.
		named := t.Digest
		if b.digest != "" {
			named = b.digest
		}
		_, ferr := s.st.FinishTemplate(context.WithoutCancel(ctx), id, store.TemplateFailed, named, "", reason)
		return ferr
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if len(layers) > 0 {
		chain, err := json.Marshal(layers)
		if err != nil {
			return err
		}
		if _, err := s.st.SetTemplateLayers(context.WithoutCancel(ctx), id, string(chain)); err != nil {
			return err
		}
	}
	logf("ready: %s", b.what)
	// Ready and its tags taken at once: a build is never ready without
	// the tags it asked for (its own first), each moved from the build
	// that held it, whose sandboxes keep running on it (Collect removes
	// it when none do).
	var ok bool
	var moved []string
	err = s.st.InTx(context.WithoutCancel(ctx), func(_ *sql.Tx, q *store.Queries) error {
		var err error
		ok, err = q.FinishTemplate(ctx, id, store.TemplateReady, b.digest, string(cfgJSON), "")
		if err != nil || !ok {
			return err
		}
		for _, tag := range def.Tags {
			_, m, err := q.TagTemplate(ctx, id, tag)
			if err != nil {
				return err
			}
			if m.ID != "" {
				moved = append(moved, fmt.Sprintf("%s:%s moved here from build %s", t.Name, tag, m.Build()))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !ok {
		s.log.Info("templates: template deleted or ended while it built", "template_id", id)
		return nil
	}
	if len(def.Tags) > 0 {
		logf("tagged %s:%s", t.Name, strings.Join(def.Tags, ", "))
	}
	for _, m := range moved {
		logf("%s", m)
	}
	s.CollectStrays(context.WithoutCancel(ctx))
	return nil
}

// fetch resolves t's image with creds and unpacks it into the cache
// unless its manifest's digest is there already. The image is resolved
// with the build's own credentials before the cache is looked at, so a
// cached image is only ever reused by a build the registry let read it.
func (s *Service) fetch(ctx context.Context, t store.Template, creds oci.Credentials, logf func(string, ...any)) (oci.Image, error) {
	opts := oci.Options{AllowPrivate: s.cfg.AllowPrivate, Limits: s.cfg.Limits, Resolver: s.cfg.Resolver,
		Logger: slog.New(logHandler{logf: logf}), Credentials: creds}
	if creds != (oci.Credentials{}) {
		// Which kind, never a secret (Credentials.String).
		logf("resolving %s with registry credentials (%s)", t.Source, creds)
	} else {
		logf("resolving %s", t.Source)
	}
	img, err := oci.Resolve(ctx, t.Source, opts)
	if err != nil {
		return oci.Image{}, err
	}
	logf("resolved to %s: %d layers, %d bytes compressed", img.ManifestDigest, len(img.Layers), img.CompressedSize)
	// Named before it is fetched: what collects unused images keeps it.
	if _, err := s.st.SetTemplateDigest(ctx, t.ID, img.ManifestDigest); err != nil {
		return oci.Image{}, err
	}
	unlock, err := lockDigest(ctx, s.cfg.Dir, img.ManifestDigest)
	if err != nil {
		return oci.Image{}, err
	}
	defer unlock()
	dir := s.rootfs(img.ManifestDigest)
	if _, err := os.Stat(dir); err == nil {
		logf("image %s is cached on this server", img.ManifestDigest)
		return img, nil
	}
	if ok := s.fromBlobStore(ctx, img.ManifestDigest, logf); ok {
		return img, nil
	}
	tmp, err := os.MkdirTemp(s.cfg.Dir, ".fetch-")
	if err != nil {
		return oci.Image{}, fmt.Errorf("templates: a directory to fetch into: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil {
		return oci.Image{}, err
	}
	// Fetch the pinned reference: the image resolved above, whatever the
	// tag points at now.
	got, err := oci.Fetch(ctx, img.Ref, filepath.Join(tmp, "rootfs"), opts)
	if err != nil {
		return oci.Image{}, err
	}
	if got.ManifestDigest != img.ManifestDigest {
		return oci.Image{}, errdefs.Newf(errdefs.ErrInvalid, "image %s changed while it was fetched", t.Source)
	}
	logf("unpacked %d bytes in %d entries (%d device nodes skipped)", got.Size, got.Entries, got.SkippedDevices)
	if err := os.Rename(filepath.Join(tmp, "rootfs"), dir); err != nil {
		return oci.Image{}, fmt.Errorf("templates: move the image into the cache: %w", err)
	}
	return got, nil
}

// logHandler turns oci's log lines (one per layer) into build log lines.
type logHandler struct {
	logf  func(string, ...any)
	attrs []slog.Attr
}

// Enabled keeps oci's Info lines (layers applied) and leaves out its
// warnings, whose errors may name host paths.
func (h logHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo && l < slog.LevelWarn
}

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	add := func(a slog.Attr) bool {
		msg += " " + a.Key + "=" + a.Value.String()
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.logf("%s", msg)
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{logf: h.logf, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }
