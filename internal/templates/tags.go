package templates

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// Builds requested, tags and rebuilds, for E2B's Template API (package
// e2b's templatebuild.go), over the rule of one template per name and
// tag: a row is one name:tag. A build is requested with its tags before
// its definition comes (Request, then Start). When a tag it asks for is
// held by another build, the new build's row waits untagged
// (store.UntaggedTag) and takes the tag when it is ready: until then the
// tag starts the old build, and a failed rebuild leaves it there. A build
// with several tags, or given more later (AssignTags), has a row per tag,
// copies of its own (store.Template.BuildID). The row that loses its tag
// stays, untagged, for the sandboxes that run it; Collect deletes it when
// none do.

// DefaultMaxBuildMemoryMiB is the most memory a build may ask for its
// build sandboxes unless the operator says otherwise.
const DefaultMaxBuildMemoryMiB = 8192

// Minimums of a build's size, E2B's.
const (
	minBuildCPUs      = 1
	minBuildMemoryMiB = 128
)

// How long strays are kept: a requested build that was never started,
// and a failed build that held no tag (its status stays readable).
const (
	waitingTTL = time.Hour
	failedTTL  = time.Hour
	settle     = time.Minute
)

// RequestSpec is a build to request: its name ("name[:tag]"), more tags,
// and the size of its build sandboxes (0: the server's).
type RequestSpec struct {
	Name      string
	Tags      []string
	CPUs      float64
	MemoryMiB int64
}

// Request records a build of spec waiting for its definition (Start):
// in the name:tag's place when no other build holds it, else untagged
// until it is ready. Tags and size are checked here (400 naming them).
func (s *Service) Request(ctx context.Context, p auth.Principal, spec RequestSpec) (store.Template, error) {
	if spec.Name == "" {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "name: required")
	}
	ref, err := templatespec.ParseRef(spec.Name)
	if err != nil {
		return store.Template{}, err
	}
	tags := []string{ref.Tag}
	for _, tag := range spec.Tags {
		if tag == "" {
			continue
		}
		if _, err := templatespec.ParseRef(ref.Name + ":" + tag); err != nil {
			return store.Template{}, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("tags: %q is not a tag", tag))
		}
		if !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	if len(tags) > maxTags {
		return store.Template{}, errdefs.Newf(errdefs.ErrInvalid, "tags: %d, at most %d a build", len(tags), maxTags)
	}
	if err := s.checkSize(spec.CPUs, spec.MemoryMiB); err != nil {
		return store.Template{}, err
	}
	if p.AccountID == "" {
		return store.Template{}, errdefs.New(errdefs.ErrForbidden, "templates belong to an account")
	}
	s.CollectStrays(ctx)
	def, err := json.Marshal(definition{Tags: tags, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB})
	if err != nil {
		return store.Template{}, err
	}
	t := store.Template{ID: store.NewID("tpl_"), AccountID: p.AccountID, Name: ref.Name, Tag: ref.Tag, Status: store.TemplateBuilding,
		NodeID: s.cfg.NodeID, Definition: string(def), Log: logLine("build of %s:%s requested", ref.Name, strings.Join(tags, ", "))}
	err = s.st.CreateTemplate(ctx, &t)
	if errors.Is(err, store.ErrConflict) {
		// Another build holds the tag: this one takes it when ready.
		t.Tag = store.UntaggedTag(t.ID)
		err = s.st.CreateTemplate(ctx, &t)
	}
	if err != nil {
		return store.Template{}, fmt.Errorf("record template: %w", err)
	}
	return t, nil
}

// maxTags bounds the tags of one build.
const maxTags = 16

// checkSize refuses a build sandbox size outside E2B's minimums and this
// server's maximums; 0 is the server's default.
func (s *Service) checkSize(cpus float64, memMiB int64) error {
	switch {
	case cpus < 0 || (cpus > 0 && cpus < minBuildCPUs):
		return errdefs.Newf(errdefs.ErrInvalid, "cpuCount: %g, at least %d", cpus, minBuildCPUs)
	case cpus > s.cfg.MaxBuildCPUs:
		return errdefs.Newf(errdefs.ErrInvalid, "cpuCount: %g is over this server's limit for builds, %g", cpus, s.cfg.MaxBuildCPUs)
	case memMiB < 0 || (memMiB > 0 && memMiB < minBuildMemoryMiB):
		return errdefs.Newf(errdefs.ErrInvalid, "memoryMB: %d, at least %d", memMiB, minBuildMemoryMiB)
	case memMiB > s.cfg.MaxBuildMemoryMiB:
		return errdefs.Newf(errdefs.ErrInvalid, "memoryMB: %d is over this server's limit for builds, %d", memMiB, s.cfg.MaxBuildMemoryMiB)
	}
	return nil
}

// Start gives the requested build id (Request) of p's account its
// source and definition, checked as Build checks them (req's Name is the
// request's), and enqueues it, in one transaction. A build started
// already is 409.
func (s *Service) Start(ctx context.Context, p auth.Principal, id string, req BuildRequest) (store.Template, error) {
	t, err := s.Get(ctx, p, id)
	if err != nil {
		return store.Template{}, err
	}
	if t.AccountID == "" {
		return store.Template{}, errdefs.New(errdefs.ErrForbidden, "public templates are the operator's")
	}
	if !t.Waiting() {
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "build %s of %s was started already", t.ID, t.Name)
	}
	req.Name, req.requested = t.Name, t.ID
	return s.Build(ctx, p, req)
}

// start records t's source, digest and definition (Build's) as the
// waiting build t.ID's, with the tags and size its request recorded,
// seals its registry credentials (when not nil) as enqueue does, and
// enqueues its build, in one transaction.
func (s *Service) start(ctx context.Context, t store.Template, creds *oci.Credentials) (store.Template, error) {
	w, err := s.st.GetTemplate(ctx, t.ID)
	if err != nil {
		return store.Template{}, err
	}
	requested, err := parseDefinition(w)
	if err != nil {
		return store.Template{}, err
	}
	var d definition
	if t.Definition != "" {
		if err := json.Unmarshal([]byte(t.Definition), &d); err != nil {
			return store.Template{}, err
		}
	}
	d.Tags, d.CPUs, d.MemoryMiB = requested.Tags, requested.CPUs, requested.MemoryMiB
	b, err := json.Marshal(d)
	if err != nil {
		return store.Template{}, err
	}
	err = s.st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		ok, err := q.StartTemplate(ctx, w.ID, t.Source, t.Digest, string(b), s.cfg.NodeID)
		if err != nil {
			return err
		}
		if !ok {
			return errdefs.Newf(errdefs.ErrConflict, "build %s of %s was started already", w.ID, w.Name)
		}
		if err := q.AppendTemplateLog(ctx, w.ID, logLine("build from %s queued", t.Source)); err != nil {
			return err
		}
		if creds != nil {
			sealed, err := s.sealer.seal(w.ID, *creds)
			if err != nil {
				return fmt.Errorf("seal the registry credentials: %w", err)
			}
			if err := q.PutTemplateCredentials(ctx, w.ID, sealed); err != nil {
				return err
			}
		}
		return s.cfg.Jobs.InsertTx(ctx, tx, jobs.BuildTemplateArgs{TemplateID: w.ID}, s.cfg.NodeID)
	})
	if err != nil {
		return store.Template{}, err
	}
	w.Source, w.Digest, w.Definition, w.NodeID = t.Source, t.Digest, string(b), s.cfg.NodeID
	return w, nil
}

// AssignTags gives the build that the account's name:tag target starts
// the tags too, each moved from the build that held it; the build must be
// ready. It returns the target.
func (s *Service) AssignTags(ctx context.Context, p auth.Principal, target string, tags []string) (store.Template, error) {
	ref, err := templatespec.ParseRef(target)
	if err != nil {
		return store.Template{}, err
	}
	if len(tags) == 0 {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "tags: none given")
	}
	if len(tags) > maxTags {
		return store.Template{}, errdefs.Newf(errdefs.ErrInvalid, "tags: %d, at most %d at once", len(tags), maxTags)
	}
	for _, tag := range tags {
		if _, err := templatespec.ParseRef(ref.Name + ":" + tag); err != nil {
			return store.Template{}, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("tags: %q is not a tag", tag))
		}
	}
	t, err := s.own(ctx, p, ref.Name, ref.Tag)
	if err != nil {
		return store.Template{}, err
	}
	if t.Status != store.TemplateReady {
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s is %s; only a ready build takes tags", target, t.Status)
	}
	for _, tag := range tags {
		_, _, err := s.st.TagTemplate(ctx, t.ID, tag)
		if err != nil {
			return store.Template{}, err
		}
	}
	s.CollectStrays(ctx)
	return t, nil
}

// RemoveTags takes the tags from the account's template name: each
// name:tag stops starting anything; the builds stay for their sandboxes
// (Collect). A tag the name does not have is 404, before any is removed.
func (s *Service) RemoveTags(ctx context.Context, p auth.Principal, name string, tags []string) error {
	if len(tags) == 0 {
		return errdefs.New(errdefs.ErrInvalid, "tags: none given")
	}
	if len(tags) > maxTags {
		return errdefs.Newf(errdefs.ErrInvalid, "tags: %d, at most %d at once", len(tags), maxTags)
	}
	for _, tag := range tags {
		if _, err := s.own(ctx, p, name, tag); err != nil {
			return err
		}
	}
	for _, tag := range tags {
		if _, err := s.st.UntagTemplate(ctx, p.AccountID, name, tag); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	s.CollectStrays(ctx)
	return nil
}

// own is p's account's own template name:tag; another's, or a public one,
// is not found.
func (s *Service) own(ctx context.Context, p auth.Principal, name, tag string) (store.Template, error) {
	t, err := s.st.FindTemplate(ctx, p.AccountID, name, tag)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (t.AccountID == "" || t.AccountID != p.AccountID)) {
		return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "template %s:%s not found", name, tag)
	}
	return t, err
}

// CollectStrays deletes the strays no sandbox needs: builds that lost
// their tags and run no sandbox, failed untagged builds after failedTTL,
// and requested builds never started after waitingTTL; each one's image
// and layers go as a delete's do (collect). Errors are logged: the next
// collection tries again. Collect (the server's collector) calls it, and
// so do the builds, requests and tag changes that make strays.
func (s *Service) CollectStrays(ctx context.Context) {
	strays, err := s.st.ListStrayTemplates(ctx)
	if err != nil {
		s.log.Warn("templates: list strays", "err", err)
		return
	}
	now := s.cfg.Now()
	for _, t := range strays {
		switch {
		case t.Waiting():
			if now.Sub(t.CreatedAt) < waitingTTL {
				continue
			}
		case t.Status == store.TemplateBuilding:
			continue
		case t.Status == store.TemplateFailed:
			if now.Sub(t.UpdatedAt) < failedTTL {
				continue
			}
		case now.Sub(t.UpdatedAt) < settle:
			// Ready and untagged: it just lost its tag, and a create
			// that found it by that tag a moment ago may not have
			// recorded its sandbox yet.
			continue
		}
		inUse, err := s.st.DeleteTemplate(ctx, t.ID)
		switch {
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue // sandboxes run it; or gone
		case err != nil:
			s.log.Warn("templates: collect a stray", "template_id", t.ID, "err", err)
			continue
		}
		s.log.Info("templates: collected", "template_id", t.ID, "name", t.Name)
		s.collect(ctx, t, inUse)
	}
}
