// Package image builds and caches the base root filesystems every sandbox
// starts from (the read-only lower layer of its overlay).
//
// A template (Template) is plain data: a Debian suite and variant, packages
// and post-install steps, or a parent template plus steps. Its content key is
// a hash of that data and a format version, and its finished image lives at
// <cache-dir>/images/<template>-<shortkey>/ as rootfs/ plus manifest.json.
//
// Invariants:
//   - An image directory exists only when complete: builds happen in a
//     temporary directory beside it that is renamed into place after the
//     manifest is written and the file system synced, so a crash leaves
//     at most a dot-directory that is ignored and later removed.
//   - At most one build of an image runs at a time across processes: builds
//     hold an flock on <id>.lock next to the image directory.
//   - Nothing is mounted below the cache in the host's mount namespace:
//     commands that need /proc, /sys or /dev run in a private namespace.
//   - Finished images are never modified, except that --force replaces one
//     whole, and Ext4 adds a sibling file rootfs.ext4.
package image

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/flock"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// Image is a finished root filesystem in the cache.
type Image struct {
	// ID is "<template>-<first 12 hex digits of Key>".
	ID       string `json:"id"`
	Template string `json:"template"`
	// Key is the content key: the hash of the template definition, the
	// builder's format version and the parent's key.
	Key string `json:"key"`
	// Parent is the ID of the image this one was built from, if any.
	Parent string `json:"parent,omitempty"`
	// Rootfs is the absolute path of the root filesystem directory.
	Rootfs string `json:"rootfs"`
	// Size is the disk space the root filesystem takes, in bytes.
	Size          int64         `json:"size"`
	CreatedAt     time.Time     `json:"created"`
	BuildDuration time.Duration `json:"-"` // in JSON as build_seconds
	// Mirror and SecurityMirror are the Debian archives the packages came
	// from; the image's APT sources point at them.
	Mirror         string `json:"mirror,omitempty"`
	SecurityMirror string `json:"security_mirror,omitempty"`
	// Highlights are the template's headline packages with their versions.
	Highlights []Package `json:"highlights"`
	// Packages is everything installed: Debian packages, then npm globals.
	Packages []Package `json:"packages"`

	dir   string
	store *Store
}

// MarshalJSON writes the image with its build duration in seconds.
func (img *Image) MarshalJSON() ([]byte, error) {
	type plain Image
	return json.Marshal(struct {
		*plain
		BuildSeconds float64 `json:"build_seconds"`
	}{(*plain)(img), math.Round(img.BuildDuration.Seconds()*10) / 10})
}

// BuildOptions change how Build works.
type BuildOptions struct {
	// Force rebuilds the image even if it is cached, replacing it. Its
	// parent is still reused from the cache.
	Force bool
	// Mirror is the Debian mirror to use; empty means the host's own
	// (see HostMirrors). Security updates come from the host's security
	// archive either way.
	Mirror string
}

// Store is the image cache in one cache directory.
type Store struct {
	dir       string
	logger    *slog.Logger
	builder   builder
	templates []Template
	// hostMirrors finds the default mirrors for a suite (HostMirrors).
	hostMirrors func(suite string) (Mirrors, error)
}

// NewStore returns the image store under cacheDir. It does no I/O; the
// directory is created on the first build.
func NewStore(cacheDir string, logger *slog.Logger) *Store {
	return newStore(cacheDir, logger, newDebootstrapBuilder(logger), Templates())
}

func newStore(cacheDir string, logger *slog.Logger, b builder, templates []Template) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(filepath.Join(cacheDir, "images"))
	if err != nil {
		dir = filepath.Join(cacheDir, "images")
	}
	return &Store{dir: dir, logger: logger, builder: b, templates: templates, hostMirrors: HostMirrors}
}

// Dir is the directory holding the images.
func (s *Store) Dir() string { return s.dir }

// Ensure returns the image of template, building it (and its parents) if
// the cache does not have it. A build reports its progress to tracker (nil:
// nowhere).
func (s *Store) Ensure(ctx context.Context, template string, tracker progress.Tracker) (*Image, error) {
	return s.Build(ctx, template, BuildOptions{}, tracker)
}

// Build builds the image of template unless the cache already has it (or
// opts.Force is set) and returns it. Concurrent builds of the same image, in
// this process or another, wait for the first one and then reuse its result.
func (s *Store) Build(ctx context.Context, template string, opts BuildOptions, tracker progress.Tracker) (*Image, error) {
	t, key, err := s.resolve(template)
	if err != nil {
		return nil, err
	}
	id := imageID(t.Name, key)
	if !opts.Force {
		if img, err := s.load(id); err == nil {
			return img, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	var parent *Image
	if t.Parent != "" {
		// The parent is built under its own lock, before this one is
		// taken, so locks are never held while waiting on another.
		parent, err = s.Build(ctx, t.Parent, BuildOptions{Mirror: opts.Mirror}, tracker)
		if err != nil {
			return nil, fmt.Errorf("build parent of %s: %w", id, err)
		}
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache: %w", err)
	}
	unlock, err := flock.Lock(ctx, filepath.Join(s.dir, id+".lock"), s.waiting(id+".lock"))
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	defer unlock()
	if !opts.Force {
		// Someone else may have built it while we waited for the lock.
		if img, err := s.load(id); err == nil {
			return img, nil
		}
	}
	if err := s.removeLeftovers(id); err != nil {
		return nil, err
	}
	return s.buildLocked(ctx, t, key, id, parent, opts, tracker)
}

// buildLocked builds the image into a temporary directory and publishes it.
// The caller holds the image's lock.
func (s *Store) buildLocked(ctx context.Context, t Template, key, id string, parent *Image, opts BuildOptions, tracker progress.Tracker) (*Image, error) {
	var mirrors Mirrors
	switch {
	case parent != nil:
		mirrors = Mirrors{Main: parent.Mirror, Security: parent.SecurityMirror}
	default:
		host, err := s.hostMirrors(t.Suite)
		if err != nil && opts.Mirror == "" {
			return nil, fmt.Errorf("build image %s: %w", id, err)
		}
		mirrors = host
		if opts.Mirror != "" {
			mirrors.Main = opts.Mirror
		}
		if mirrors.Security == "" {
			s.logger.Warn("no Debian security archive in the host's APT sources: the image gets no security updates past the point release", "image", id)
		}
	}
	tmp, err := os.MkdirTemp(s.dir, ".build-"+id+"-")
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	published := false
	defer func() {
		if !published {
			if err := removeTree(tmp); err != nil {
				s.logger.Error("remove failed image build", "dir", tmp, "err", err)
			}
		}
	}()
	// MkdirTemp makes the directory private; the published image must be
	// readable by whoever runs sandboxes from it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}

	start := time.Now()
	s.logger.Info("building image", "image", id, "template", t.Name, "mirror", mirrors.Main, "security_mirror", mirrors.Security)
	task := progress.Or(tracker).Start("building image "+id, progress.Percent, 100)
	req := buildRequest{
		Template:         t,
		Rootfs:           rootfs,
		Parent:           parent,
		Mirrors:          mirrors,
		ExpectedPackages: s.expectedPackages(t.Name),
		Report:           func(ev Event) { task.Update(ev.state()) },
	}
	err = s.builder.build(ctx, req)
	task.Done(err)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}

	pkgs, err := installedPackages(rootfs)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	size, _, err := diskUsage(rootfs)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	m := manifest{
		ID:             id,
		Template:       t.Name,
		Key:            key,
		Format:         formatVersion,
		Mirror:         mirrors.Main,
		SecurityMirror: mirrors.Security,
		CreatedAt:      time.Now().UTC().Truncate(time.Second),
		Size:           size,
		BuildDuration:  time.Since(start).Seconds(),
		Highlights:     highlights(pkgs, t.Highlights),
		Packages:       pkgs,
	}
	if parent != nil {
		m.Parent = parent.ID
	}
	if err := writeManifest(tmp, m); err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	if err := syncDir(tmp); err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	if err := s.publish(tmp, id); err != nil {
		return nil, err
	}
	published = true
	img, err := s.load(id)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", id, err)
	}
	s.logger.Info("built image", "image", id, "size_mib", size>>20, "packages", len(pkgs), "elapsed", img.BuildDuration.Round(100*time.Millisecond))
	return img, nil
}

// publish renames the finished build directory tmp to the image's place,
// moving an existing image (a forced rebuild) aside first and removing it
// after.
func (s *Store) publish(tmp, id string) error {
	final := filepath.Join(s.dir, id)
	var old string
	if _, err := os.Lstat(final); err == nil {
		aside, err := os.MkdirTemp(s.dir, ".old-"+id+"-")
		if err != nil {
			return fmt.Errorf("replace image %s: %w", id, err)
		}
		old = filepath.Join(aside, id)
		if err := os.Rename(final, old); err != nil {
			return fmt.Errorf("replace image %s: %w", id, err)
		}
		defer func() {
			if err := removeTree(aside); err != nil {
				s.logger.Error("remove replaced image", "dir", aside, "err", err)
			}
		}()
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("publish image %s: %w", id, err)
	}
	return fsyncDir(s.dir)
}

// removeLeftovers deletes what crashed or interrupted builds of id left
// behind. The caller holds the image's lock, so none of it is in use.
func (s *Store) removeLeftovers(id string) error {
	for _, pattern := range []string{".build-" + id + "-*", ".old-" + id + "-*"} {
		matches, err := filepath.Glob(filepath.Join(s.dir, pattern))
		if err != nil {
			return fmt.Errorf("find leftovers of %s: %w", id, err)
		}
		for _, m := range matches {
			s.logger.Info("removing leftover of an interrupted build", "dir", m)
			if err := removeTree(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// expectedPackages is the package count of the newest cached image of the
// template, whatever its key, as a guess for the next build's progress.
func (s *Store) expectedPackages(template string) int {
	images, err := s.List(context.Background())
	if err != nil {
		return 0
	}
	for _, img := range images {
		if img.Template == template {
			n := 0
			for _, p := range img.Packages {
				if p.Source == "deb" {
					n++
				}
			}
			return n
		}
	}
	return 0
}

// Lookup returns the cached image of template if it has been built, without
// building it; the error wraps fs.ErrNotExist if it has not.
func (s *Store) Lookup(template string) (*Image, error) {
	t, key, err := s.resolve(template)
	if err != nil {
		return nil, err
	}
	return s.load(imageID(t.Name, key))
}

// List returns the images in the cache, newest first. Directories without a
// readable manifest are not images and are left out.
func (s *Store) List(ctx context.Context) ([]*Image, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []*Image
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		img, err := s.load(e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			// One damaged image must not hide the others; Build
			// with Force replaces it.
			s.logger.Warn("skipping unreadable image", "image", e.Name(), "err", err)
			continue
		}
		out = append(out, img)
	}
	slices.SortFunc(out, func(a, b *Image) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// load reads the image with the given ID from its manifest.
func (s *Store) load(id string) (*Image, error) {
	dir := filepath.Join(s.dir, id)
	m, err := readManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("load image %s: %w", id, err)
	}
	if m.ID != id {
		return nil, fmt.Errorf("load image %s: manifest names %q", id, m.ID)
	}
	return &Image{
		ID:             m.ID,
		Template:       m.Template,
		Key:            m.Key,
		Parent:         m.Parent,
		Rootfs:         filepath.Join(dir, "rootfs"),
		Size:           m.Size,
		CreatedAt:      m.CreatedAt,
		BuildDuration:  time.Duration(m.BuildDuration * float64(time.Second)),
		Mirror:         m.Mirror,
		SecurityMirror: m.SecurityMirror,
		Highlights:     m.Highlights,
		Packages:       m.Packages,
		dir:            dir,
		store:          s,
	}, nil
}

// resolve finds the template and computes its key, following parents.
func (s *Store) resolve(name string) (Template, string, error) {
	return s.resolveDepth(name, 0)
}

func (s *Store) resolveDepth(name string, depth int) (Template, string, error) {
	if depth > len(s.templates) {
		return Template{}, "", fmt.Errorf("template %s: parent cycle", name)
	}
	i := slices.IndexFunc(s.templates, func(t Template) bool { return t.Name == name })
	if i < 0 {
		names := make([]string, len(s.templates))
		for j, t := range s.templates {
			names[j] = t.Name
		}
		return Template{}, "", fmt.Errorf("unknown template %q (have %s)", name, strings.Join(names, ", "))
	}
	t := s.templates[i]
	if err := t.validate(); err != nil {
		return Template{}, "", err
	}
	parentKey := ""
	if t.Parent != "" {
		_, k, err := s.resolveDepth(t.Parent, depth+1)
		if err != nil {
			return Template{}, "", fmt.Errorf("template %s: %w", name, err)
		}
		parentKey = k
	}
	return t, t.key(parentKey), nil
}

// waiting logs, for flock.Lock, that another build holds the lock.
func (s *Store) waiting(lock string) func() {
	return func() {
		s.logger.Info("waiting for another build of the same image to finish", "lock", filepath.Join(s.dir, lock))
	}
}
