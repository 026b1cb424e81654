package templates

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// The bases a template's steps run over besides an image fetched for it:
// another template (fromTemplate, Build) and the server's built-in image
// (the base of a template saved from a sandbox that runs on it,
// FromSandbox). A template's row names its base by Digest: an image's
// manifest digest, whose root filesystem is in the cache, or
// BuiltinDigest of the built-in image, which the Catalog resolves to the
// directory the server runs sandboxes from (SetBuiltin).

// base is what a build's steps start from.
type base struct {
	// digest is the row's Digest: the cached image's ("sha256:…") or
	// the built-in's (BuiltinDigest).
	digest string
	// key is what the steps' cache keys chain from
	// (templatespec.CacheKeys' baseDigest).
	key string
	// dir is the root filesystem, image the BaseImage its sandboxes
	// record.
	dir, image string
	config     oci.Config
	// layers is the chain under the steps' layers (a parent's).
	layers []string
	// what names the base in the log's last line.
	what string
}

// imageBase fetches t's image into the cache (unless its digest is
// there) as the base of its steps.
func (s *Service) imageBase(ctx context.Context, t store.Template, creds oci.Credentials, logf func(string, ...any)) (base, error) {
	img, err := s.fetch(ctx, t, creds, logf)
	if err != nil {
		return base{}, err
	}
	return base{digest: img.ManifestDigest, key: img.ManifestDigest, dir: s.rootfs(img.ManifestDigest), image: "oci:" + img.ManifestDigest,
		config: img.Config, what: img.Ref + " (" + img.Platform + ")"}, nil
}

// parent is a template built over, as it was when the build was asked for
// (a ready template does not change): what its child starts from.
type parent struct {
	ID       string     `json:"id"`
	Ref      string     `json:"ref"` // name:tag
	Digest   string     `json:"digest"`
	Layers   []string   `json:"layers,omitempty"`
	Config   oci.Config `json:"config"`
	StartCmd string     `json:"startCmd,omitempty"`
	ReadyCmd string     `json:"readyCmd,omitempty"`
}

// parentBase is p's state as the base of t's steps. The parent's row is
// not read again: a parent deleted since leaves its child's build whole
// (the child's row names the digest, which keeps the cached image, and
// layer blobs are not collected while a template names them).
func (s *Service) parentBase(ctx context.Context, t store.Template, p parent, logf func(string, ...any)) (base, error) {
	dir, image, err := s.catalog.base(ctx, p.Digest, p.Ref)
	if err != nil {
		return base{}, err
	}
	logf("over template %s (%s): %d layers", p.Ref, p.ID, len(p.Layers))
	return base{digest: p.Digest, key: parentKey(p), dir: dir, image: image, config: p.Config, layers: slices.Clone(p.Layers),
		what: "over template " + p.Ref}, nil
}

// parentKey is what a child's cache keys chain from: the parent's base
// digest, its layer chain and the config its steps run with (ENV, WORKDIR
// and USER make no layer, yet change what a RUN makes).
func parentKey(p parent) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field("sandboxd template parent key v1")
	field(p.Digest)
	field(fmt.Sprint(len(p.Layers)))
	for _, l := range p.Layers {
		field(l)
	}
	field(fmt.Sprint(len(p.Config.Env)))
	for _, e := range p.Config.Env {
		field(e)
	}
	field(p.Config.WorkingDir)
	field(p.Config.User)
	return "template:sha256:" + hex.EncodeToString(h.Sum(nil))
}

// errRegistryOverTemplate refuses credentials with fromTemplate.
var errRegistryOverTemplate = errdefs.New(errdefs.ErrInvalid, "registry and fromTemplate: registry credentials are for an image's pull; a template over another pulls nothing")

// buildOver is Build of a template over another (req.FromTemplate): the
// parent must be ready; its state is recorded with the child's
// definition, and the child's row names the parent's digest from the
// start (so that the cached image stays while the child builds, whatever
// happens to the parent).
func (s *Service) buildOver(ctx context.Context, p auth.Principal, ref templatespec.Ref, req BuildRequest) (store.Template, error) {
	switch {
	case strings.TrimSpace(req.Image) != "":
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "image and fromTemplate: give one base, not both")
	case req.Dockerfile != "":
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "dockerfile and fromTemplate: a Dockerfile's FROM is an image; give the steps as JSON (\"steps\") over a template")
	case req.Registry != nil:
		return store.Template{}, errRegistryOverTemplate
	case p.AccountID == "":
		return store.Template{}, errdefs.New(errdefs.ErrForbidden, "templates belong to an account")
	}
	par, err := s.resolveParent(ctx, p, strings.TrimSpace(req.FromTemplate))
	if err != nil {
		return store.Template{}, err
	}
	pimg, err := s.catalog.image(ctx, par)
	if err != nil {
		return store.Template{}, err
	}
	// The child inherits the parent's start and ready commands unless it
	// gives its own.
	if req.StartCmd == "" && req.ReadyCmd == "" {
		req.StartCmd, req.ReadyCmd = pimg.StartCmd, pimg.ReadyCmd
	}
	_, def, err := s.definition(BuildRequest{Steps: req.Steps, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, FromTemplate: par.ID})
	if err != nil {
		return store.Template{}, err
	}
	var d definition
	if def != "" {
		if err := json.Unmarshal([]byte(def), &d); err != nil {
			return store.Template{}, err
		}
	}
	d.Parent = &parent{ID: par.ID, Ref: pimg.Ref, Digest: par.Digest, Layers: pimg.Layers, Config: pimg.Config,
		StartCmd: pimg.StartCmd, ReadyCmd: pimg.ReadyCmd}
	if len(d.Steps) > 0 || d.StartCmd != d.Parent.StartCmd || d.ReadyCmd != d.Parent.ReadyCmd {
		if err := s.canBuildSteps(); err != nil {
			return store.Template{}, err
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return store.Template{}, err
	}
	t := store.Template{ID: req.requested, AccountID: p.AccountID, Name: ref.Name, Tag: ref.Tag, Source: "template:" + pimg.Ref, Status: store.TemplateBuilding,
		NodeID: s.cfg.NodeID, Digest: par.Digest, Definition: string(b),
		Log: logLine("build of %s:%s over template %s (%s) queued", ref.Name, ref.Tag, pimg.Ref, par.ID)}
	return s.enqueue(ctx, t, nil)
}

// resolveParent finds the template a build is over: by id (the one
// access rule: another account's is not found) or by "name[:tag]" (the
// account's own, else a public one). Building is 409, failed 400.
func (s *Service) resolveParent(ctx context.Context, p auth.Principal, ref string) (store.Template, error) {
	var t store.Template
	var err error
	if strings.HasPrefix(ref, "tpl_") {
		t, err = s.Get(ctx, p, ref)
		if errors.Is(err, errdefs.ErrNotFound) {
			return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "fromTemplate: template %s not found", ref)
		}
	} else {
		var r templatespec.Ref
		if r, err = templatespec.ParseRef(ref); err != nil {
			return store.Template{}, fmt.Errorf("fromTemplate: %w", err)
		}
		t, err = s.st.FindTemplate(ctx, p.AccountID, r.Name, r.Tag)
		if errors.Is(err, store.ErrNotFound) {
			return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "fromTemplate: template %s not found", r)
		}
	}
	if err != nil {
		return store.Template{}, err
	}
	switch t.Status {
	case store.TemplateBuilding:
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "fromTemplate: template %s:%s is still building; build over it when it is ready", t.Name, t.Tag)
	case store.TemplateFailed:
		return store.Template{}, errdefs.Newf(errdefs.ErrInvalid, "fromTemplate: template %s:%s failed to build (%s); a template is built over a ready one", t.Name, t.Tag, t.FailureReason)
	}
	return t, nil
}

// Builtin is the server's built-in image: the root filesystem sandboxes
// without a template start from (sandbox.Config's BaseDir and BaseID).
type Builtin struct {
	ID  string // the image's id, runtime.Spec.BaseImage
	Dir string // its root filesystem
}

const builtinPrefix = "builtin:"

var plainBuiltinID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// BuiltinDigest is the Digest of a template whose base is the built-in
// image of id: "builtin:<id>", or "builtin:rootfs-<hash>" for an id that
// is not a plain name (an operator's --rootfs, whose id names a host
// path, which the API must not show).
func BuiltinDigest(id string) string {
	if plainBuiltinID.MatchString(id) {
		return builtinPrefix + id
	}
	sum := sha256.Sum256([]byte(id))
	return builtinPrefix + "rootfs-" + hex.EncodeToString(sum[:8])
}

func isBuiltin(digest string) bool { return strings.HasPrefix(digest, builtinPrefix) }

// SetBuiltin makes b the built-in image templates saved on it resolve to;
// call it before the catalog is used.
func (c *Catalog) SetBuiltin(b Builtin) { c.builtin = b }

// builtinBase resolves BuiltinDigest(id) to the built-in image, when it
// is the one this server runs: a template saved on another (an older
// built-in image, another server's) does not start here.
func (c *Catalog) builtinBase(digest, ref string) (dir, baseImage string, err error) {
	if c.builtin.ID == "" || c.builtin.Dir == "" || BuiltinDigest(c.builtin.ID) != digest {
		return "", "", errdefs.Newf(errdefs.ErrConflict, "template %s was saved on the built-in image %s, which this server does not run", ref, strings.TrimPrefix(digest, builtinPrefix))
	}
	return c.builtin.Dir, c.builtin.ID, nil
}
