// Package templates owns templates, the root filesystems sandboxes start
// from besides the built-in image: their build (a River job that fetches
// an OCI image with package oci into this node's cache, then runs the
// template's steps, if any, in build sandboxes a BuildHost starts, a
// layer per RUN stored in the blob store and cached by step key), their
// rows (store.Template: building, ready, failed, a bounded build log, the
// layer chain), who may see them (an account's own and the operator's
// public ones) and what a sandbox from one starts with (Image: the root
// filesystem, the layers, the Env, WORKDIR and USER). This slice builds
// from images with RUN, COPY, ENV, ARG, WORKDIR and USER steps (COPY
// reading the archives an account uploaded, files.go), over other
// templates (fromTemplate, from.go), and saves running sandboxes' files
// as templates (FromSandbox, save.go); docs/TEMPLATES.md says what is not
// built yet. E2B's builds requested before their definition, several tags
// a build, tag moves and rebuilds are tags.go's.
//
// Invariants:
//
//   - The cache (Config.Dir) is private to root (0700): images carry
//     setuid files (see package oci). An image is unpacked once per
//     manifest digest, into a temporary directory renamed into place, so
//     a root filesystem in the cache is always whole; a build whose digest
//     is cached fetches no layer. Unpacking, materialising and removing
//     a digest's directory take the digest's lock (lockDigest).
//   - A template is ready only once its image's root filesystem is in the
//     blob store (when there is one), by digest (distribute.go); a node
//     whose cache lacks it materialises it from there, with oci's safety
//     and limits, before a sandbox starts from it.
//   - A template names its digest from the resolve of its build on (and
//     when it failed), and an image is collected only when no template
//     names its digest (gc.go); a blob is deleted only when no template,
//     build cache entry, stored image or snapshot names it; a cache entry
//     no template names goes CacheKeep after it was made or last taken,
//     and a build takes one only by renewing it (UseTemplateLayer).
//   - Builds survive a restart: the job is inserted with the row, a
//     restarted node enqueues its unfinished builds again (Resume), and a
//     job that finds its row still building builds it (again, from the
//     start); one that finds it ended does nothing. The builds of a node
//     declared down are enqueued for any node (AdoptBuilds).
//   - A build's failure reason and log lines are for its user
//     (errdefs.Message): never a cause, a host path or a credential.
//   - Registry credentials are never stored in the clear and never
//     outlive their build: Build seals them (AES-256-GCM under the
//     server's key, Config.CredentialsKey, bound to the template's id) into the
//     store's template_credentials, in the transaction that records the
//     template; the build job opens them for the pull (also when it runs
//     again after a restart), and they are deleted with the build's end
//     (store.FinishTemplate) or the template. They are in no row of
//     templates, no job's arguments, no log line and no answer.
//   - A step's layer is reused only from its own account's cache, under
//     the key of the base's digest and every step up to it
//     (templatespec.CacheKeys); a cache hit is taken only while every
//     layer before it was one too (the chain), and never past a forced
//     step. A template's layers are restored in order over its image;
//     a layer that cannot be opened fails the start, never skips.
//   - Uploaded build files are an account's own, named by a hash the
//     client chooses; an archive is read on the host only as a checked,
//     bounded stream (archive.go), and a COPY writes its files into the
//     build sandbox through the sandbox's agent, never into a host path.
//   - Access: a template of another account is not found; public
//     templates (account "") are read by all and changed by none through
//     this service. A parent (fromTemplate) and a sandbox to save are
//     found under the same rule.
//   - A template's row names its whole base: the digest of its root
//     filesystem (an image in the cache, or BuiltinDigest of the
//     built-in image) and its whole layer chain, a parent's included; so
//     a child never needs its parent's row, the cached image stays while
//     a row names its digest, and the snapshots' collection keeps the
//     blobs a chain names (store.CountTemplatesWithBlob).
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
	goruntime "runtime"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// Access is the one access rule (auth.Authenticator's MayActFor).
type Access interface {
	MayActFor(ctx context.Context, p auth.Principal, target string) (bool, error)
}

// Config builds a Service.
type Config struct {
	Store *store.Store
	// Jobs inserts build jobs; nil: Build fails (tests of the worker call
	// Run themselves).
	Jobs   *jobs.Client
	NodeID string
	// Dir is the cache of unpacked images, made 0700 if missing.
	Dir string
	// AllowPrivate lets registries on private, loopback and link-local
	// addresses be pulled from (--templates-allow-private-registries).
	AllowPrivate bool
	// Limits bound an image (oci's defaults for zero fields).
	Limits oci.Limits
	// Resolver resolves registry hosts (default: the system's).
	Resolver fetch.Resolver
	// Blobs holds the layers the steps of builds make (content-addressed,
	// like the accounts' snapshots); nil: templates with steps are refused.
	Blobs blob.Store
	// StepTimeout bounds one step of a build (default DefaultStepTimeout),
	// BuildTimeout a whole build (default DefaultBuildTimeout).
	StepTimeout, BuildTimeout time.Duration
	// CacheKeep is how long a build cache entry no template names is
	// kept after it was made or last taken (default DefaultCacheKeep).
	CacheKeep time.Duration
	// BuildNetwork is the network policy of build sandboxes (default:
	// egress to public addresses).
	BuildNetwork netpol.Policy
	// MaxUploadBytes bounds an uploaded archive of build files as sent
	// (default DefaultMaxUploadBytes).
	MaxUploadBytes int64
	// UploadSecret is what upload links (SignUpload) are signed with a
	// key derived from: the same on every node of a cluster, kept across
	// restarts (serve gives CredentialsKey); nil: a random key of this
	// process.
	UploadSecret []byte
	// Access is the one access rule; nil: auth.NewAuthenticator(Store).
	Access Access
	// MaxBuildCPUs and MaxBuildMemoryMiB bound the size a build may ask
	// for its build sandboxes (E2B's cpuCount and memoryMB); defaults: the
	// host's CPUs (at least 2), DefaultMaxBuildMemoryMiB.
	MaxBuildCPUs      float64
	MaxBuildMemoryMiB int64
	// CredentialsKey (KeyBytes: LoadOrCreateKey's, or KeyFromSecret's in
	// a cluster, where every node must have the same) seals the registry
	// credentials of builds until they run; nil: builds with credentials
	// are refused.
	CredentialsKey []byte
	// Host starts the build sandboxes of templates with steps (the
	// sandbox manager, which reads templates through a Catalog of its own);
	// nil: templates with steps are refused.
	Host BuildHost
	// Saver captures running sandboxes' files for FromSandbox (the
	// sandbox manager); nil: saving a sandbox as a template is refused.
	Saver SandboxSaver
	// Builtin is the server's built-in image, the base of templates saved
	// from sandboxes that run on it (zero: such templates are refused).
	Builtin Builtin
	Logger  *slog.Logger
	// Now is the clock of collections (Collect); default time.Now.
	Now func() time.Time
}

// Service is the templates service.
type Service struct {
	cfg Config
	st  *store.Store
	// host starts build sandboxes (Config.Host); nil: templates with
	// steps are refused.
	host BuildHost
	// catalog reads the templates sandboxes start from.
	catalog *Catalog
	// building holds a place per build sandbox running on this node.
	building chan struct{}
	access   Access
	// sealer seals builds' registry credentials; nil without a key.
	sealer *sealer
	log    *slog.Logger
	// uploadKey signs upload links (files.go).
	uploadKey []byte
	// filesOf is a build sandbox's filesystem for COPY
	// (filecopy.AgentFS; tests replace it).
	filesOf func(context.Context, runtime.Sandbox) (filecopy.FS, error)
}

// New returns a Service, making its cache directory.
func New(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	catalog, err := NewCatalog(cfg.Store, cfg.Dir, cfg.Blobs, WithLogger(cfg.Logger), WithLimits(cfg.Limits))
	if err != nil {
		return nil, err
	}
	catalog.SetBuiltin(cfg.Builtin)
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	if cfg.BuildTimeout <= 0 {
		cfg.BuildTimeout = DefaultBuildTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxBuildCPUs <= 0 {
		// At least E2B's default (the older SDKs always send 2): a CPU
		// quota over the host's CPUs is the whole host.
		cfg.MaxBuildCPUs = float64(max(goruntime.NumCPU(), 2))
	}
	if cfg.MaxBuildMemoryMiB <= 0 {
		cfg.MaxBuildMemoryMiB = DefaultMaxBuildMemoryMiB
	}
	if cfg.CacheKeep <= 0 {
		cfg.CacheKeep = DefaultCacheKeep
	}
	if cfg.BuildNetwork.Mode == "" {
		cfg.BuildNetwork = netpol.Policy{Mode: netpol.ModeEgress}
	}
	if err := cfg.BuildNetwork.Validate(); err != nil {
		return nil, fmt.Errorf("templates: the build network: %w", err)
	}
	s := &Service{cfg: cfg, st: cfg.Store, host: cfg.Host, catalog: catalog, access: cfg.Access, log: cfg.Logger, building: make(chan struct{}, maxBuildSandboxes)}
	if cfg.CredentialsKey != nil {
		if s.sealer, err = newSealer(cfg.CredentialsKey); err != nil {
			return nil, err
		}
	}
	if s.access == nil {
		s.access = auth.NewAuthenticator(cfg.Store)
	}
	s.filesOf = filecopy.AgentFS
	if s.uploadKey, err = uploadKey(cfg.UploadSecret); err != nil {
		return nil, err
	}
	return s, nil
}

// Catalog reads the templates sandboxes start from: their rows and this
// node's cache of their images. The sandbox manager holds one and the
// Service another over the same directory, so that neither is made after
// the other (the Service starts build sandboxes through the manager).
type Catalog struct {
	st    *store.Store
	dir   string
	blobs blob.Store
	// limits bound an image materialised from the blob store; log says
	// when one is (distribute.go).
	limits oci.Limits
	log    *slog.Logger
	// builtin is the server's built-in image (SetBuiltin), the base of
	// the templates whose digest is BuiltinDigest(builtin.ID).
	builtin Builtin
}

// NewCatalog returns the catalog of the templates in st whose images are
// cached in dir (made private, 0700: images keep their setuid files) and
// whose layers and root filesystems are in blobs (nil: templates with
// layers do not start, and images not in the cache are not brought there).
func NewCatalog(st *store.Store, dir string, blobs blob.Store, opts ...CatalogOption) (*Catalog, error) {
	if dir == "" {
		return nil, errors.New("templates: no cache directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("templates: make the cache: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("templates: make the cache private: %w", err)
	}
	c := &Catalog{st: st, dir: dir, blobs: blobs, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// BuildRequest is a template to build, as the front ends decode it: an
// image or another template (FromTemplate), with steps (the steps JSON,
// templatespec.FromJSON's "steps"), or a Dockerfile (whose FROM is the
// image), or neither. The other sources are refused by name.
type BuildRequest struct {
	// Name is "name[:tag]" (templatespec.ParseRef).
	Name string
	// Image is an OCI image reference, "host/repo[:tag|@digest]"; empty
	// with a Dockerfile.
	Image string
	// Steps is the JSON array of steps (E2B's TemplateStep); nil: none.
	Steps json.RawMessage
	// Dockerfile is a Dockerfile's text; "": none.
	Dockerfile string
	// StartCmd is run by a shell in every sandbox from the template when
	// it starts, and keeps running; ReadyCmd is run by a shell until it
	// exits 0, and the sandbox is running from then on. Either may be "".
	StartCmd, ReadyCmd string
	// Context names the account's uploaded archive (PutFiles) a
	// Dockerfile's COPY steps copy from; "": none.
	Context string
	// Registry authenticates the pull of the image: a username and
	// password (or an access token used as the password), or a registry
	// token; nil: anonymous. Sealed until the build runs (see the package
	// doc); never in the template's row.
	Registry *oci.Credentials
	// FromTemplate is the template to build over, by "name[:tag]" or id
	// (the account's own or a public one); "": Image is the base.
	FromTemplate string
	// requested is the requested build (Request) this definition starts
	// (Start); "": a new template.
	requested string
}

// Build validates req, records the template building and enqueues its
// build on this node, in one transaction.
func (s *Service) Build(ctx context.Context, p auth.Principal, req BuildRequest) (store.Template, error) {
	if req.Registry != nil && strings.TrimSpace(req.FromTemplate) != "" {
		return store.Template{}, errRegistryOverTemplate
	}
	if req.Registry != nil {
		if err := checkCredentials(*req.Registry); err != nil {
			return store.Template{}, err
		}
		if s.sealer == nil {
			return store.Template{}, errdefs.New(errdefs.ErrInvalid, "registry: this server keeps no key for registry credentials; build from a public image")
		}
	}
	if req.Name == "" {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "name: required")
	}
	ref, err := templatespec.ParseRef(req.Name)
	if err != nil {
		return store.Template{}, err
	}
	if strings.TrimSpace(req.FromTemplate) != "" {
		return s.buildOver(ctx, p, ref, req)
	}
	image, def, err := s.definition(req)
	if err != nil {
		return store.Template{}, err
	}
	if def != "" {
		if err := s.canBuildSteps(); err != nil {
			return store.Template{}, err
		}
		if err := s.checkUploads(ctx, p.AccountID, def); err != nil {
			return store.Template{}, err
		}
	}
	switch {
	case image == "":
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "image: required")
	case len(image) > 512:
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "image: longer than 512 characters")
	}
	if p.AccountID == "" {
		return store.Template{}, errdefs.New(errdefs.ErrForbidden, "templates belong to an account")
	}
	t := store.Template{ID: req.requested, AccountID: p.AccountID, Name: ref.Name, Tag: ref.Tag, Source: image, Status: store.TemplateBuilding, NodeID: s.cfg.NodeID,
		Definition: def, Log: logLine("build of %s:%s from %s queued", ref.Name, ref.Tag, image)}
	return s.enqueue(ctx, t, req.Registry)
}

// enqueue records t building, with creds sealed (nil: none), and inserts
// its build job, in one transaction; a t with an ID is a requested build
// that starts (tags.go's start).
func (s *Service) enqueue(ctx context.Context, t store.Template, creds *oci.Credentials) (store.Template, error) {
	if s.cfg.Jobs == nil {
		return store.Template{}, errors.New("templates: no job queue")
	}
	if t.ID != "" {
		// The requested build t.ID (Request, Start) takes t's source,
		// digest and definition.
		return s.start(ctx, t, creds)
	}
	err := s.st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		if err := q.CreateTemplate(ctx, &t); err != nil {
			return err
		}
		if creds != nil {
			sealed, err := s.sealer.seal(t.ID, *creds)
			if err != nil {
				return fmt.Errorf("seal the registry credentials: %w", err)
			}
			if err := q.PutTemplateCredentials(ctx, t.ID, sealed); err != nil {
				return err
			}
		}
		return s.cfg.Jobs.InsertTx(ctx, tx, jobs.BuildTemplateArgs{TemplateID: t.ID}, s.cfg.NodeID)
	})
	if errors.Is(err, store.ErrConflict) {
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s:%s exists; delete it first or choose another tag", t.Name, t.Tag)
	}
	if err != nil {
		return store.Template{}, fmt.Errorf("record template: %w", err)
	}
	return t, nil
}

// List returns the caller's account's templates and the public ones.
func (s *Service) List(ctx context.Context, p auth.Principal) ([]store.Template, error) {
	return s.st.ListTemplates(ctx, p.AccountID)
}

// Get returns template id when p may see it (its account's, or public);
// else, as when it does not exist, errdefs.ErrNotFound.
func (s *Service) Get(ctx context.Context, p auth.Principal, id string) (store.Template, error) {
	notFound := errdefs.New(errdefs.ErrNotFound, "Template not found")
	t, err := s.st.GetTemplate(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, notFound
	}
	if err != nil {
		return store.Template{}, err
	}
	if t.AccountID == "" {
		return t, nil
	}
	ok, err := s.access.MayActFor(ctx, p, t.AccountID)
	if err != nil {
		return store.Template{}, err
	}
	if !ok {
		return store.Template{}, notFound
	}
	return t, nil
}

// Delete deletes template id of p's account; refused (409) while a live
// sandbox (running or paused) started from it, and for a public one (403).
// The cached root filesystem goes when no other template names its image.
func (s *Service) Delete(ctx context.Context, p auth.Principal, id string) error {
	t, err := s.Get(ctx, p, id)
	if err != nil {
		return err
	}
	if t.AccountID == "" {
		return errdefs.New(errdefs.ErrForbidden, "public templates are the operator's")
	}
	inUse, err := s.st.DeleteTemplate(ctx, id)
	switch {
	case errors.Is(err, store.ErrConflict):
		return errdefs.Newf(errdefs.ErrConflict, "template %s:%s is in use by running or paused sandboxes; stop them first", t.Name, t.Tag)
	case errors.Is(err, store.ErrNotFound):
		return errdefs.New(errdefs.ErrNotFound, "Template not found")
	case err != nil:
		return err
	}
	s.collect(ctx, t, inUse)
	return nil
}

// Image is what a sandbox from a template starts from.
type Image struct {
	TemplateID string
	Ref        string // "name:tag"
	// RootFS is the unpacked image (runtime.Spec.BaseDir); BaseImage
	// names it ("oci:<digest>").
	RootFS    string
	BaseImage string
	Config    oci.Config
	// StartCmd and ReadyCmd are its start and ready commands ("": none).
	StartCmd, ReadyCmd string
	// Layers are the blob keys of the layer chain its steps made, bottom
	// first (none for a template from an image alone); OpenLayers opens
	// them for runtime.Spec.Layers.
	Layers []string
	// Snapshot: the template is a named snapshot (store.TemplateKindSnapshot).
	Snapshot bool
	blobs    blob.Store
}

// OpenLayers opens img's layer chain for a sandbox's spec; release closes
// what was opened. A layer missing from the blob store is an error (the
// template cannot start without it).
func (img Image) OpenLayers(ctx context.Context) (layers []runtime.Layer, release func(), err error) {
	return openLayers(ctx, img.blobs, img.Layers)
}

// Find resolves "name[:tag]" for account: its own template, else a public
// one; or a template's id (its own or a public one). It must be ready: building is a 409 that says so, failed a 409
// with its reason; unknown is a 404.
func (c *Catalog) Find(ctx context.Context, accountID, name string) (Image, error) {
	if strings.HasPrefix(name, "tpl_") && !strings.Contains(name, ":") {
		// An id: the account's own or a public one, holding its tag (one
		// replaced or untagged is kept only for its running sandboxes).
		t, err := c.st.GetTemplate(ctx, name)
		if err == nil && (t.AccountID == "" || t.AccountID == accountID) && !t.Untagged() {
			return c.image(ctx, t)
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return Image{}, err
		}
	}
	ref, err := templatespec.ParseRef(name)
	if err != nil {
		return Image{}, err
	}
	t, err := c.st.FindTemplate(ctx, accountID, ref.Name, ref.Tag)
	if errors.Is(err, store.ErrNotFound) {
		return Image{}, errdefs.Newf(errdefs.ErrNotFound, "template %s not found", ref)
	}
	if err != nil {
		return Image{}, err
	}
	return c.image(ctx, t)
}

// ByID is the image of template id, for a sandbox that started from it
// (a restart, a resume): it must still be ready (and is materialised from
// the blob store when this node's cache lacks it).
func (c *Catalog) ByID(ctx context.Context, id string) (Image, error) {
	t, err := c.st.GetTemplate(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Image{}, errdefs.New(errdefs.ErrNotFound, "its template was deleted")
	}
	if err != nil {
		return Image{}, err
	}
	return c.image(ctx, t)
}

func (c *Catalog) image(ctx context.Context, t store.Template) (Image, error) {
	ref := t.Name + ":" + t.Tag
	switch t.Status {
	case store.TemplateBuilding:
		return Image{}, errdefs.Newf(errdefs.ErrConflict, "template %s is still building; try again when it is ready", ref)
	case store.TemplateFailed:
		return Image{}, errdefs.Newf(errdefs.ErrConflict, "template %s failed to build: %s", ref, t.FailureReason)
	}
	var cfg oci.Config
	if err := json.Unmarshal([]byte(t.Config), &cfg); err != nil {
		return Image{}, fmt.Errorf("template %s: its config: %w", t.ID, err)
	}
	dir, baseImage, err := c.base(ctx, t.Digest, ref)
	if err != nil {
		return Image{}, err
	}
	var layers []string
	if t.Layers != "" {
		if err := json.Unmarshal([]byte(t.Layers), &layers); err != nil {
			return Image{}, fmt.Errorf("template %s: its layers: %w", t.ID, err)
		}
	}
	if len(layers) > 0 && c.blobs == nil {
		return Image{}, errdefs.Newf(errdefs.ErrConflict, "template %s has layers and this server has no blob store for them", ref)
	}
	def, err := parseDefinition(t)
	if err != nil {
		return Image{}, err
	}
	return Image{TemplateID: t.ID, Ref: ref, RootFS: dir, BaseImage: baseImage, Config: cfg, Layers: layers, blobs: c.blobs,
		StartCmd: def.StartCmd, ReadyCmd: def.ReadyCmd, Snapshot: t.IsSnapshot()}, nil
}

// base is the root filesystem of a ready template of digest, and the
// BaseImage its sandboxes record: an image in this node's cache
// ("oci:<digest>"), or the server's built-in image (BuiltinDigest).
func (c *Catalog) base(ctx context.Context, digest, ref string) (dir, baseImage string, err error) {
	if isBuiltin(digest) {
		return c.builtinBase(digest, ref)
	}
	// Built on another node (or its cache was cleared): brought here
	// from the blob store.
	if dir, err = c.rootFS(ctx, digest, ref); err != nil {
		return "", "", err
	}
	return dir, "oci:" + digest, nil
}

// rootfs is where the image of digest ("sha256:...") is unpacked.
func (c *Catalog) rootfs(digest string) string {
	return filepath.Join(c.dir, strings.ReplaceAll(digest, ":", "-"))
}

// rootfs is where the image of digest is unpacked (the catalog's).
func (s *Service) rootfs(digest string) string { return s.catalog.rootfs(digest) }

// Find resolves "name[:tag]" as the catalog does.
func (s *Service) Find(ctx context.Context, accountID, name string) (Image, error) {
	return s.catalog.Find(ctx, accountID, name)
}

// logLine is one line of a build log, timestamped.
func logLine(format string, a ...any) string {
	return time.Now().UTC().Format(time.RFC3339) + " " + fmt.Sprintf(format, a...) + "\n"
}

// Resume enqueues again the build of each template this node was
// building when it stopped: a job cut by a shutdown or a crash would
// otherwise wait for River's retry or rescue. A build that runs twice is
// harmless: one finishes the row, the other finds it ended (or the image
// cached) and does nothing.
func (s *Service) Resume(ctx context.Context) error {
	if s.cfg.Jobs == nil {
		return nil
	}
	// Credentials of builds that are not building any more (ended or
	// deleted by a way that did not delete them) go now.
	if n, err := s.st.DeleteStaleTemplateCredentials(ctx); err != nil {
		return err
	} else if n > 0 {
		s.log.Info("templates: deleted the registry credentials of ended builds", "count", n)
	}
	building, err := s.st.ListBuildingTemplates(ctx, s.cfg.NodeID)
	if err != nil {
		return err
	}
	for _, t := range building {
		if t.Waiting() {
			continue // no build to run until it is started (Start)
		}
		if err := s.cfg.Jobs.Insert(ctx, jobs.BuildTemplateArgs{TemplateID: t.ID}, s.cfg.NodeID); err != nil {
			return err
		}
		s.log.Info("templates: build resumed", "template_id", t.ID)
	}
	s.CollectStrays(ctx)
	return nil
}

// AdoptBuilds enqueues on the shared queue, where any node's worker takes
// it, the build of each template node nodeID, declared down, was building:
// its job is held by that node's worker and would wait for it to come
// back. If it does, its Resume enqueues the build again: whichever runs
// second finds the row ended (or builds it once more, harmlessly).
func (s *Service) AdoptBuilds(ctx context.Context, nodeID string) (int, error) {
	if s.cfg.Jobs == nil {
		return 0, nil
	}
	building, err := s.st.ListBuildingTemplates(ctx, nodeID)
	if err != nil {
		return 0, err
	}
	for i, t := range building {
		if err := s.cfg.Jobs.Insert(ctx, jobs.BuildTemplateArgs{TemplateID: t.ID}, ""); err != nil {
			return i, err
		}
		s.log.Info("templates: build of a down node taken over", "template_id", t.ID, "node_id", nodeID)
	}
	return len(building), nil
}

// RegisterWorkers adds the build worker to w.
func (s *Service) RegisterWorkers(w *river.Workers) {
	river.AddWorker(w, &buildWorker{s: s})
}
