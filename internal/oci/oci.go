// Package oci fetches an OCI or Docker image from a registry and unpacks it
// into a root filesystem directory: the first step of a template built from
// an image. It owns resolving a reference to a digest, choosing the host's
// platform from an index, applying the layers in order and reading the
// parts of the image's config a sandbox needs (Env, WorkingDir, User,
// Entrypoint, Cmd, ExposedPorts). It does not cache, store or run anything.
//
// Images, registries and the names in them are untrusted. Invariants:
//
//   - Network: every connection, to the registry, its token service or a
//     blob redirect, goes through fetch.Dialer: the host is resolved once
//     and the checked address is dialled, so DNS rebinding cannot reach
//     what the check refused. Private, loopback, link-local and CGNAT
//     addresses are refused unless Options.AllowPrivate (the operator's
//     flag); cloud metadata endpoints always. Environment proxies and the
//     host's registry credentials (docker config files) are never used.
//   - Credentials (Options.Credentials) go to the registry's auth exchange
//     only: as Basic auth to the registry the reference names, or to the
//     token service its Bearer challenge names (https unless the registry
//     is plain HTTP), which answers a token sent to that registry alone;
//     never to a host a request is redirected to (a blob CDN gets no
//     Authorization header: go-containerregistry's transports set it only
//     for the registry's host, and auth_test.go holds them to it). They are
//     never logged (Credentials prints and logs redacted), never stored,
//     and never in an error's text, even when a registry echoes them back
//     (errors are scrubbed of them).
//   - Layers are applied by snapshot.ApplyTar with OCI whiteouts: every
//     file operation is relative to dir's descriptor through openat2 with
//     RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so no entry name, hard link or
//     symlink (a layer's own or a lower layer's) reaches outside dir; names
//     with ".." or absolute names are refused; hard links must name paths
//     inside the image. Symlinks are kept as the image wrote them
//     (absolute targets are normal in images: they mean the sandbox's
//     root) but never followed on the host. A layer that writes through a
//     directory symlink of a lower layer is refused: image builders record
//     real paths, and following the link, even within dir, is what this
//     package never does.
//   - Device nodes are skipped, not refused: real base images carry
//     /dev entries, the sandbox's runtime provides its own /dev, and a
//     device node on the host disk would give whoever reaches it the
//     host's device. Image.SkippedDevices counts them. FIFOs are kept.
//   - Ownership (uid/gid as the layer says) and permission bits are kept,
//     setuid and setgid included (sudo in images needs them), and so are
//     file capabilities. A setuid-root file on the host disk is a host
//     privilege for whoever can execute it there, so Fetch refuses to
//     unpack unless dir's parent directory is private to this process's
//     user (mode 0700 or stricter, owned by the effective uid): the cache
//     directory templates live in must be root-only, and any mount of a
//     rootfs on the host must be nosuid or equally private.
//     Options.DropSetID drops them instead (as sandbox snapshots do) for a
//     caller that cannot promise that.
//   - Limits (Limits, defaults below) are checked from the manifest before
//     a byte of a layer is read, and again while reading: a decompression
//     bomb stops at MaxBytes of uncompressed tar, not after. Over a limit
//     is an errdefs.ErrTooLarge error whose message names the limit.
//   - On error dir is removed: a half-unpacked image is never left behind.
package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
)

// Defaults of Limits. They fit the largest common development images
// (several GiB uncompressed, a few hundred thousand files) with room, and
// stop what no real image needs.
const (
	// DefaultMaxLayers: Docker's builders stop short of 128 layers.
	DefaultMaxLayers = 128
	// DefaultMaxLayerBytes bounds one layer's compressed blob.
	DefaultMaxLayerBytes = 4 << 30
	// DefaultMaxBytes bounds the uncompressed tar of all layers together.
	DefaultMaxBytes = 16 << 30
	// DefaultMaxEntries bounds the entries (files, directories, links,
	// whiteouts) of all layers together.
	DefaultMaxEntries = 1_000_000
	// DefaultMaxConfigBytes bounds the image's config blob, read into
	// memory (real ones are kilobytes, long histories included).
	DefaultMaxConfigBytes = 4 << 20
)

// Limits bound what one image may cost the host. Zero fields take the
// defaults. Past one, Resolve or Fetch fails with errdefs.ErrTooLarge and a
// message naming it. MaxLayers, MaxLayerBytes and MaxConfigBytes are
// checked from the manifest before any layer is read (the byte limits
// again while reading); MaxBytes and MaxEntries while the layers are
// read, so nothing past them is decompressed or written.
type Limits struct {
	MaxLayers      int   // layers in the image
	MaxLayerBytes  int64 // compressed bytes of one layer's blob
	MaxBytes       int64 // uncompressed tar bytes of all layers together
	MaxEntries     int   // tar entries of all layers together
	MaxConfigBytes int64 // bytes of the config blob
}

func (l Limits) withDefaults() Limits {
	if l.MaxLayers <= 0 {
		l.MaxLayers = DefaultMaxLayers
	}
	if l.MaxLayerBytes <= 0 {
		l.MaxLayerBytes = DefaultMaxLayerBytes
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxConfigBytes <= 0 {
		l.MaxConfigBytes = DefaultMaxConfigBytes
	}
	return l
}

// Options configure one Resolve or Fetch. The zero value pulls a public
// image anonymously for the host's platform under the default limits.
type Options struct {
	// Credentials authenticate to the registry (zero: anonymous).
	Credentials Credentials
	// AllowPrivate allows registries on private, loopback, link-local and
	// CGNAT addresses (the operator's flag).
	AllowPrivate bool
	// Insecure talks plain HTTP to the registry. Registries on loopback
	// and RFC 1918 addresses are spoken to in plain HTTP anyway.
	Insecure bool
	// Platform is "os/arch[/variant]" (default "linux/" + the runtime's
	// architecture).
	Platform string
	// DropSetID drops setuid and setgid bits and file capabilities, and
	// with them the requirement that dir's parent be private.
	DropSetID bool
	Limits    Limits
	// Resolver resolves registry host names (default: the system's).
	Resolver fetch.Resolver
	// Logger gets one line per layer (default: discard). Credentials are
	// never logged.
	Logger *slog.Logger
}

// Config is what a sandbox takes from the image's config.
type Config struct {
	Env          []string // "KEY=value", in the image's order
	WorkingDir   string
	User         string   // "name", "uid", "uid:gid", ... as the image says
	Entrypoint   []string // with Cmd, the image's start command
	Cmd          []string
	ExposedPorts []string // "8080/tcp", sorted
}

// Image describes a resolved (and, after Fetch, unpacked) image.
type Image struct {
	// Ref is the reference pinned by Digest: "host/repo@sha256:...".
	// Fetching it again gets the same image (for the same platform).
	Ref string
	// Digest is what the reference resolved to: an index's digest for a
	// multi-platform image, else the image manifest's.
	Digest string
	// ManifestDigest is the chosen platform's image manifest: the image's
	// identity, the key for a cache of unpacked images.
	ManifestDigest string
	Platform       string // "linux/amd64"
	// Layers are the layers' digests, bottom first.
	Layers []string
	// CompressedSize is the sum of the layers' blobs.
	CompressedSize int64
	// Size is the uncompressed size of the layers' tars (after Fetch).
	Size int64
	// Entries and SkippedDevices count the layers' entries and the device
	// nodes (and hard links to them) not created (after Fetch).
	Entries        int
	SkippedDevices int
	Config         Config
}

// Resolve resolves ref to its digest and the host platform's image and
// reads its manifest and config, checking the limits that the manifest
// alone can tell, without reading a layer.
func Resolve(ctx context.Context, ref string, opts Options) (Image, error) {
	p, err := newPull(ctx, ref, opts)
	if err != nil {
		return Image{}, p.fail(err)
	}
	return p.img, nil
}

// Fetch resolves ref as Resolve does and unpacks the image into dir, which
// must not exist; its parent must be private unless opts.DropSetID (see
// the package doc). On error dir is removed.
func Fetch(ctx context.Context, ref, dir string, opts Options) (Image, error) {
	if !opts.DropSetID {
		if err := checkPrivateParent(dir); err != nil {
			return Image{}, err
		}
	}
	p, err := newPull(ctx, ref, opts)
	if err != nil {
		return Image{}, p.fail(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return Image{}, fmt.Errorf("oci: create rootfs: %w", err)
	}
	if err := p.unpack(ctx, dir); err != nil {
		if rerr := os.RemoveAll(dir); rerr != nil {
			p.log.WarnContext(ctx, "oci: remove a partly unpacked image", "err", rerr)
		}
		return Image{}, p.fail(err)
	}
	return p.img, nil
}

// pull is one Resolve or Fetch in progress.
type pull struct {
	ref    string // as the caller wrote it, for messages
	opts   Options
	lim    Limits
	log    *slog.Logger
	image  v1.Image
	layers []v1.Layer
	img    Image
}

func newPull(ctx context.Context, ref string, opts Options) (*pull, error) {
	p := &pull{ref: ref, opts: opts, lim: opts.Limits.withDefaults(), log: opts.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	plat, err := platform(opts.Platform)
	if err != nil {
		return p, err
	}
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nameOpts...)
	if err != nil {
		return p, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("%q is not a valid image reference", ref))
	}
	dialer := &fetch.Dialer{Policy: fetch.Policy{AllowPrivate: opts.AllowPrivate}, Resolver: opts.Resolver}
	if err := dialer.CheckHost(hostOf(r.Context().RegistryStr())); err != nil {
		return p, err
	}
	transport := &http.Transport{
		Proxy:                 nil, // never: a proxy would dial for us, unchecked
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          8,
		IdleConnTimeout:       30 * time.Second,
		DisableCompression:    true, // blobs are what they are; no transparent gunzip
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(transport),
		remote.WithAuth(opts.Credentials.authenticator()), // never a keychain: the host's credentials are not the user's
		remote.WithPlatform(plat),
		remote.WithUserAgent("sandboxd"),
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return p, err
	}
	img, err := desc.Image()
	if err != nil {
		if desc.MediaType.IsIndex() {
			return p, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("image %s has no variant for %s", ref, plat))
		}
		return p, err
	}
	p.image = img
	m, err := img.Manifest()
	if err != nil {
		return p, err
	}
	md, err := img.Digest()
	if err != nil {
		return p, err
	}
	p.img = Image{
		Ref:            r.Context().Digest(desc.Digest.String()).String(),
		Digest:         desc.Digest.String(),
		ManifestDigest: md.String(),
		Platform:       plat.String(),
	}
	if err := p.checkManifest(m); err != nil {
		return p, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return p, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the config of image %s cannot be read", ref))
	}
	// A single-platform image is taken as it is by the library: its
	// config says what it runs on.
	if (cfg.OS != "" && cfg.OS != plat.OS) || (cfg.Architecture != "" && cfg.Architecture != plat.Architecture) {
		return p, errdefs.Newf(errdefs.ErrInvalid, "image %s is for %s/%s, not %s", ref, cfg.OS, cfg.Architecture, plat)
	}
	p.img.Config = configOf(cfg)
	if p.layers, err = img.Layers(); err != nil {
		return p, err
	}
	return p, nil
}

// checkManifest applies the limits the manifest tells before any layer is
// read: its declared sizes are checked again while reading.
func (p *pull) checkManifest(m *v1.Manifest) error {
	if n := len(m.Layers); n > p.lim.MaxLayers {
		return errdefs.Newf(errdefs.ErrTooLarge, "image %s has %d layers, more than the limit of %d", p.ref, n, p.lim.MaxLayers)
	}
	if m.Config.Size > p.lim.MaxConfigBytes {
		return errdefs.Newf(errdefs.ErrTooLarge, "the config of image %s is %s, larger than the limit of %s", p.ref, fetch.FormatSize(m.Config.Size), fetch.FormatSize(p.lim.MaxConfigBytes))
	}
	for i, l := range m.Layers {
		if l.Size < 0 || l.Size > p.lim.MaxLayerBytes {
			return layerTooLarge(p.ref, i, p.lim.MaxLayerBytes)
		}
		p.img.Layers = append(p.img.Layers, l.Digest.String())
		p.img.CompressedSize += l.Size
	}
	return nil
}

func layerTooLarge(ref string, i int, limit int64) error {
	return errdefs.Newf(errdefs.ErrTooLarge, "layer %d of image %s is larger than the limit of %s compressed", i+1, ref, fetch.FormatSize(limit))
}

func configOf(cf *v1.ConfigFile) Config {
	c := cf.Config
	out := Config{
		Env:        slices.Clone(c.Env),
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
	}
	for port := range c.ExposedPorts {
		out.ExposedPorts = append(out.ExposedPorts, port)
	}
	slices.Sort(out.ExposedPorts)
	return out
}

// platform parses s, defaulting to linux on the runtime's architecture.
func platform(s string) (v1.Platform, error) {
	if s == "" {
		p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
		if runtime.GOARCH == "arm64" {
			p.Variant = "v8"
		}
		return p, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, errdefs.Newf(errdefs.ErrInvalid, "%q is not a platform (os/arch[/variant])", s)
	}
	return *p, nil
}

// hostOf is the host of a registry's "host[:port]".
func hostOf(registry string) string {
	if strings.HasPrefix(registry, "[") {
		if i := strings.Index(registry, "]"); i > 0 {
			return registry[1:i]
		}
	}
	if i := strings.LastIndex(registry, ":"); i >= 0 && strings.Count(registry, ":") == 1 {
		return registry[:i]
	}
	return registry
}

// checkPrivateParent makes sure no other user of the host can reach dir,
// which will hold the image's setuid files: whoever cannot search its
// parent cannot reach anything under it.
func checkPrivateParent(dir string) error {
	parent := filepath.Dir(filepath.Clean(dir))
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("oci: the directory for the rootfs: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("oci: %s must be a directory of mode 0700 owned by uid %d to hold images' setuid files (or set DropSetID): %w",
			parent, os.Geteuid(), ErrNotPrivate)
	}
	return nil
}

// ErrNotPrivate is returned by Fetch when the parent of its target is not
// private (see the package doc): the caller's setup is wrong, not the
// image.
var ErrNotPrivate = errors.New("oci: the rootfs's parent directory is not private")
