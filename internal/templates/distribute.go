package templates

// Templates in a cluster. A build unpacks its image into its node's cache
// (fetch); before the template is ready its root filesystem is stored in
// the blob store (S3 in a cluster) as one sandboxd layer of the whole
// directory (snapshot.Write: numeric owners, modes with setuid bits,
// hard links, symlinks as written, xattrs user.* and
// security.capability, holes), recorded by the image manifest's digest
// (store.TemplateImage). A node whose cache lacks a digest materialises
// it from there on first use: once per digest at a time (a lock file per
// digest, so the sandbox manager's Catalog and the Service's share it),
// into a temporary directory renamed into place, with oci's
// unpack rules (snapshot.ApplyTar in OCI mode: nothing outside the
// directory, no symlink followed, no device node) and oci's limits.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
)

// lockDigest takes the cache's lock of digest for the unpacking, the
// materialising or the removal of its root filesystem, waiting for it
// within ctx. The lock is a file lock (flock) on a file of the digest's
// own, so two Catalogs over one cache in a process (the manager's and the
// Service's) take turns as two goroutines of one do, and other digests
// never wait. removeLockFile, with the lock held, removes the file (with
// its digest's directory): a waiter that then gets the lock of the
// removed file finds the path gone or another file there, and starts
// again on the path's.
func lockDigest(ctx context.Context, dir, digest string) (unlock func(), err error) {
	locks := filepath.Join(dir, ".locks")
	if err := os.MkdirAll(locks, 0o700); err != nil {
		return nil, fmt.Errorf("templates: the cache's locks: %w", err)
	}
	path := lockPath(dir, digest)
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("templates: open a cache lock: %w", err)
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil || (!errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR)) {
				break
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("templates: take a cache lock: %w", err)
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return func() { f.Close() }, nil // closing releases it
		}
		f.Close() // removed while this waited: the path's file is the lock
	}
}

// lockPath is the lock file of digest.
func lockPath(dir, digest string) string {
	return filepath.Join(dir, ".locks", strings.ReplaceAll(digest, ":", "-"))
}

// removeLockFile removes the lock file of digest; the caller holds it.
func removeLockFile(dir, digest string) error {
	if err := os.Remove(lockPath(dir, digest)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// CatalogOption changes a Catalog.
type CatalogOption func(*Catalog)

// WithLogger logs a Catalog's materialising of images (default: discard).
func WithLogger(l *slog.Logger) CatalogOption {
	return func(c *Catalog) { c.log = l }
}

// WithLimits bounds what materialising one image may write (oci's
// defaults for zero fields): its uncompressed tar and its entries.
func WithLimits(l oci.Limits) CatalogOption {
	return func(c *Catalog) { c.limits = l }
}

// rootFS returns the cached root filesystem of digest, materialising it
// from the blob store when this node's cache lacks it. ref names the
// template in errors.
func (c *Catalog) rootFS(ctx context.Context, digest, ref string) (string, error) {
	if digest == "" || strings.ContainsAny(digest, "/\x00") || strings.HasPrefix(digest, ".") {
		return "", fmt.Errorf("template %s: its digest %q names no image", ref, digest)
	}
	dir := c.rootfs(digest)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	unlock, err := lockDigest(ctx, c.dir, digest)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil // materialised while this waited
	}
	if err := c.materialise(ctx, digest); err != nil {
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, blob.ErrNotFound) || errors.Is(err, errNoBlobStore) {
			return "", errdefs.Wrap(errdefs.ErrConflict, err, fmt.Sprintf("template %s is not on this server and its root filesystem is not in the blob store (built on another server before templates were stored there); build it again", ref))
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		msg := fmt.Sprintf("template %s: its root filesystem could not be brought to this server", ref)
		// A reason for the user (a limit, the disk) says why; a hostile
		// or damaged blob's details stay in the log.
		if why := errdefs.Message(err, ""); why != "" {
			msg += ": " + why
		}
		var class error
		if errors.Is(err, errdefs.ErrTooLarge) {
			class = errdefs.ErrTooLarge
		}
		return "", errdefs.Wrap(class, err, msg)
	}
	return dir, nil
}

var errNoBlobStore = errors.New("templates: no blob store")

// materialise brings the root filesystem of digest from the blob store
// into the cache. The caller holds the digest's lock and found it absent.
func (c *Catalog) materialise(ctx context.Context, digest string) error {
	if c.blobs == nil {
		return errNoBlobStore
	}
	start := time.Now()
	img, err := c.st.GetTemplateImage(ctx, digest)
	if err != nil {
		return err
	}
	lim := limitsOrDefaults(c.limits)
	if img.Bytes > lim.MaxBytes || img.Entries > int64(lim.MaxEntries) {
		return errdefs.Newf(errdefs.ErrTooLarge, "image %s: %d bytes in %d entries is over the limits (%s, %d entries)",
			digest, img.Bytes, img.Entries, fetch.FormatSize(lim.MaxBytes), lim.MaxEntries)
	}
	// What its files take, and an inode's worth per entry: refused at
	// once rather than filling the disk halfway.
	need := img.Bytes + img.Entries*512
	if err := snapshot.CheckFree(c.dir, need); err != nil {
		return errdefs.Wrap(nil, err, fmt.Sprintf("this server has not the free disk space for the image (%s); try again later", fetch.FormatSize(need)))
	}
	rc, err := c.blobs.Get(ctx, img.BlobKey)
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp, err := os.MkdirTemp(c.dir, ".materialise-")
	if err != nil {
		return fmt.Errorf("templates: a directory to materialise into: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil {
		return err
	}
	into := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(into, 0o755); err != nil {
		return err
	}
	// The blob is read to its end (the store checks its hash there), and
	// the tar it holds is bounded as an image's layers are.
	m, st, err := snapshot.ApplyWhole(ctx, rc, into, lim.MaxBytes, snapshot.TarOptions{
		Whiteouts: snapshot.OCIWhiteouts, KeepSetID: true, MaxEntries: lim.MaxEntries})
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
	}
	switch {
	case errors.Is(err, snapshot.ErrTarTooLarge):
		return errdefs.Wrap(errdefs.ErrTooLarge, err, fmt.Sprintf("image %s is larger than the limit of %s uncompressed", digest, fetch.FormatSize(lim.MaxBytes)))
	case errors.Is(err, snapshot.ErrTooManyEntries):
		return errdefs.Wrap(errdefs.ErrTooLarge, err, fmt.Sprintf("image %s has more than %d entries", digest, lim.MaxEntries))
	case err != nil:
		return fmt.Errorf("templates: materialise %s from blob %s: %w", digest, short(img.BlobKey), err)
	}
	if m.BaseImage != "oci:"+digest {
		return fmt.Errorf("templates: blob %s holds %q, not the root filesystem of %s", short(img.BlobKey), m.BaseImage, digest)
	}
	if err := os.Rename(into, c.rootfs(digest)); err != nil {
		return fmt.Errorf("templates: move the image into the cache: %w", err)
	}
	c.log.Info("templates: image materialised from the blob store", "digest", digest, "blob", short(img.BlobKey),
		"compressed", img.Size, "bytes", img.Bytes, "entries", st.Entries, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// limitsOrDefaults fills l's zero fields with oci's defaults.
func limitsOrDefaults(l oci.Limits) oci.Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = oci.DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = oci.DefaultMaxEntries
	}
	return l
}

// distribute stores the cached root filesystem of digest in the blob
// store, unless it is there already, so that every node can start the
// template: the build is ready only after it. A server without a blob
// store keeps it in its cache alone.
func (s *Service) distribute(ctx context.Context, digest string, logf func(string, ...any)) error {
	if s.cfg.Blobs == nil {
		logf("no blob store: the root filesystem is on this server only")
		return nil
	}
	if img, err := s.st.GetTemplateImage(ctx, digest); err == nil {
		if _, err := s.cfg.Blobs.Stat(ctx, img.BlobKey); err == nil {
			logf("root filesystem already in the blob store (%s)", short(img.BlobKey))
			return nil
		} else if !errors.Is(err, blob.ErrNotFound) {
			return err
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	start := time.Now()
	pr, pw := io.Pipe()
	var m snapshot.Manifest
	go func() {
		var err error
		m, err = snapshot.Write(ctx, pw, s.rootfs(digest), snapshot.Manifest{BaseImage: "oci:" + digest}, nil)
		pw.CloseWithError(err)
	}()
	info, err := s.cfg.Blobs.Put(ctx, pr)
	pr.CloseWithError(err) // ends Write when Put failed first
	if err != nil {
		return errdefs.Wrap(nil, err, "the root filesystem could not be stored in the blob store")
	}
	// Put has read to the end: Write returned and m is set.
	if err := s.st.PutTemplateImage(ctx, store.TemplateImage{Digest: digest, BlobKey: info.Key, Size: info.Size,
		Bytes: m.Bytes, Entries: int64(m.Entries)}); err != nil {
		return err
	}
	logf("root filesystem stored in the blob store: %s, %d bytes compressed (%d bytes in %d entries) in %s",
		short(info.Key), info.Size, m.Bytes, m.Entries, time.Since(start).Round(time.Millisecond))
	return nil
}

// cachedDigests lists the digests this node's cache holds.
func (c *Catalog) cachedDigests() ([]string, error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if d, ok := digestOf(e.Name()); ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// fromBlobStore materialises the image of digest from the blob store for
// a build on a node whose cache lacks it, rather than fetching it from
// its registry again; false when it is not there (or could not be
// brought), and the build fetches it. The caller holds the digest's lock.
func (s *Service) fromBlobStore(ctx context.Context, digest string, logf func(string, ...any)) bool {
	start := time.Now()
	err := s.catalog.materialise(ctx, digest)
	switch {
	case err == nil:
		logf("image %s taken from the blob store in %s", digest, time.Since(start).Round(time.Millisecond))
		return true
	case errors.Is(err, store.ErrNotFound) || errors.Is(err, blob.ErrNotFound) || errors.Is(err, errNoBlobStore):
	default:
		s.log.Warn("templates: materialise an image for a build; fetching it instead", "digest", digest, "err", err)
	}
	return false
}

// digestOf is the digest a name in the cache stands for ("sha256-<hex>").
func digestOf(name string) (string, bool) {
	algo, hex, ok := strings.Cut(name, "-")
	if !ok || algo != "sha256" || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", false
	}
	return algo + ":" + hex, true
}
