package templates

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// DefaultCacheKeep is how long a build cache entry that no template
// names is kept after it was made or last taken: a rebuild within it (a
// delete and a build again, the way to change a name:tag) skips the
// steps it holds.
const DefaultCacheKeep = 7 * 24 * time.Hour

// CollectInterval is how often RunCollector collects.
const CollectInterval = time.Hour

// RunCollector collects (Collect) at once, then every CollectInterval
// until ctx ends.
func (s *Service) RunCollector(ctx context.Context) {
	t := time.NewTicker(CollectInterval)
	defer t.Stop()
	for {
		s.Collect(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// busyLockWait is how long a collection waits for a digest's lock.
const busyLockWait = 5 * time.Second

// staleTempAge is how old a temporary directory of the cache (a fetch
// or a materialise a crash cut) must be before Collect removes it: live
// ones are younger by far.
const staleTempAge = 24 * time.Hour

// collect is what the delete of t leaves to collect: its image's root
// filesystem (this node's cached copy and its blob) when no other
// template names the digest, and the blobs of its layers that nothing
// names any more. Best effort: what fails is logged, and the image's
// copies on other nodes go at their next Collect.
func (s *Service) collect(ctx context.Context, t store.Template, digestInUse bool) {
	ctx = context.WithoutCancel(ctx)
	if t.Digest != "" && !digestInUse && !isBuiltin(t.Digest) {
		s.collectImage(ctx, t.Digest)
	}
	if t.Layers == "" {
		return
	}
	var layers []string
	if err := json.Unmarshal([]byte(t.Layers), &layers); err != nil {
		s.log.Warn("templates: the layers of a deleted template", "template_id", t.ID, "err", err)
		return
	}
	for _, key := range layers {
		s.collectBlob(ctx, key, "layer")
	}
}

// collectBlob deletes a template's blob (a layer, a root filesystem)
// unless a template, an account's build cache, a root filesystem's row or
// a snapshot still names it.
func (s *Service) collectBlob(ctx context.Context, key, what string) {
	if s.cfg.Blobs == nil {
		return
	}
	inUse, err := s.st.TemplateBlobInUse(ctx, key)
	if err != nil {
		s.log.Warn("templates: count a blob's users", "blob", key, "err", err)
		return
	}
	if inUse {
		return
	}
	if err := s.cfg.Blobs.Delete(ctx, key); err != nil {
		s.log.Warn("templates: delete a blob", "blob", key, "err", err)
		return
	}
	s.log.Info("templates: blob collected", "what", what, "blob", key)
}

// collectImage removes the root filesystem of digest when no template
// names it: this node's cached copy (under the digest's lock, so that no
// materialise or fetch of it runs meanwhile) and its lock file, then its
// row and blob in the blob store.
func (s *Service) collectImage(ctx context.Context, digest string) {
	if n, err := s.st.CountTemplatesWithDigest(ctx, digest); err != nil || n > 0 {
		if err != nil {
			s.log.Warn("templates: count the templates of an image", "digest", digest, "err", err)
		}
		return
	}
	if s.holds(digest) {
		removed, err := s.removeCached(ctx, digest)
		if err != nil {
			s.log.Warn("templates: remove a cached image", "digest", digest, "err", err)
			return
		}
		if !removed {
			return // named again meanwhile
		}
	}
	img, deleted, err := s.st.DeleteUnusedTemplateImage(ctx, digest)
	if err != nil {
		s.log.Warn("templates: delete an image's row", "digest", digest, "err", err)
		return
	}
	if deleted {
		s.collectBlob(ctx, img.BlobKey, "root filesystem "+digest)
	}
}

// holds says whether this node's cache has anything of digest: its
// directory or its lock file.
func (s *Service) holds(digest string) bool {
	for _, p := range []string{s.rootfs(digest), lockPath(s.cfg.Dir, digest)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// removeCached removes this node's copy of digest and its lock file,
// under the lock, unless a template names the digest by then; false when
// one does.
func (s *Service) removeCached(ctx context.Context, digest string) (bool, error) {
	// A fetch or a materialise holding the lock may take long: the
	// delete that asked does not wait for it, the next collection comes.
	lctx, cancel := context.WithTimeout(ctx, busyLockWait)
	defer cancel()
	unlock, err := lockDigest(lctx, s.cfg.Dir, digest)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		s.log.Info("templates: a cached image is busy; left to the next collection", "digest", digest)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unlock()
	n, err := s.st.CountTemplatesWithDigest(ctx, digest)
	if err != nil || n > 0 {
		return false, err
	}
	if _, err := os.Stat(s.rootfs(digest)); err == nil {
		if err := os.RemoveAll(s.rootfs(digest)); err != nil {
			return false, err
		}
		s.log.Info("templates: cached image collected", "digest", digest)
	}
	return true, removeLockFile(s.cfg.Dir, digest)
}

// Collect removes what no template needs any more: the template builds
// that lost their tags and run no sandbox (CollectStrays), the images in this
// node's cache and the root filesystems in the blob store whose digest no
// template names (those of templates deleted on other nodes, of builds
// that resolved again to another digest), the build cache entries no
// template names that were not made or taken for CacheKeep, with their
// layers, and temporary directories a crash left in the cache. Best
// effort: what fails is logged and tried again next time.
func (s *Service) Collect(ctx context.Context) {
	s.CollectStrays(ctx)
	s.collectCache(ctx)
	digests, err := s.catalog.cachedDigests()
	if err != nil {
		s.log.Warn("templates: list the cache", "err", err)
	}
	seen := map[string]bool{}
	for _, d := range digests {
		seen[d] = true
		s.collectImage(ctx, d)
	}
	// The locks of digests whose fetch or materialise failed.
	if locks, err := os.ReadDir(filepath.Join(s.cfg.Dir, ".locks")); err == nil {
		for _, l := range locks {
			if d, ok := digestOf(l.Name()); ok && !seen[d] {
				seen[d] = true
				s.collectImage(ctx, d)
			}
		}
	}
	imgs, err := s.st.ListTemplateImages(ctx)
	if err != nil {
		s.log.Warn("templates: list the stored images", "err", err)
	}
	for _, img := range imgs {
		if !seen[img.Digest] {
			s.collectImage(ctx, img.Digest)
		}
	}
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !(strings.HasPrefix(e.Name(), ".fetch-") || strings.HasPrefix(e.Name(), ".materialise-")) {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < staleTempAge {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.cfg.Dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("templates: remove a stale directory of the cache", "dir", e.Name(), "err", err)
		}
	}
}

// collectCache deletes the build cache entries no template names that
// were not made or taken for CacheKeep, and their layers' blobs when
// nothing else names them.
func (s *Service) collectCache(ctx context.Context) {
	gone, err := s.st.DeleteUnusedTemplateLayers(ctx, time.Now().Add(-s.cfg.CacheKeep))
	if err != nil {
		s.log.Warn("templates: collect the build cache", "err", err)
		return
	}
	for _, l := range gone {
		s.collectBlob(ctx, l.BlobKey, "cached layer")
	}
	if len(gone) > 0 {
		s.log.Info("templates: build cache entries collected", "entries", len(gone))
	}
}
