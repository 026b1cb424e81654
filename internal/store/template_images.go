package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// TemplateImage is the root filesystem of an image templates were built
// from, stored as one blob (a layer of the whole directory) so that every
// node can materialise it: by the image manifest's digest, which is what
// templates name.
type TemplateImage struct {
	Digest    string // "sha256:..." of the image manifest
	BlobKey   string
	Size      int64 // compressed bytes (the blob's)
	Bytes     int64 // uncompressed file content
	Entries   int64
	CreatedAt time.Time
}

// PutTemplateImage records img, replacing the row of its digest (a blob
// that was lost and stored again).
func (q *Queries) PutTemplateImage(ctx context.Context, img TemplateImage) error {
	if img.Digest == "" || img.BlobKey == "" {
		return fmt.Errorf("put template image: %w: digest and blob key are required", ErrInvalid)
	}
	if img.CreatedAt.IsZero() {
		img.CreatedAt = nowMS()
	}
	_, err := q.exec(ctx, `INSERT INTO template_images (digest, blob_key, size, bytes, entries, created_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET blob_key = excluded.blob_key, size = excluded.size, bytes = excluded.bytes,
		entries = excluded.entries, created_at = excluded.created_at`,
		img.Digest, img.BlobKey, img.Size, img.Bytes, img.Entries, toMillis(img.CreatedAt))
	if err != nil {
		return fmt.Errorf("put template image %s: %w", img.Digest, mapErr(err))
	}
	return nil
}

// GetTemplateImage returns the stored root filesystem of digest, or
// ErrNotFound.
func (q *Queries) GetTemplateImage(ctx context.Context, digest string) (TemplateImage, error) {
	img := TemplateImage{Digest: digest}
	var created int64
	err := q.queryRow(ctx, "SELECT blob_key, size, bytes, entries, created_at FROM template_images WHERE digest = ?", digest).
		Scan(&img.BlobKey, &img.Size, &img.Bytes, &img.Entries, &created)
	if err != nil {
		return TemplateImage{}, fmt.Errorf("get template image %s: %w", digest, notFound(err))
	}
	img.CreatedAt = fromMillis(created)
	return img, nil
}

// DeleteUnusedTemplateImage deletes the row of digest when no template
// (building, ready or failed) names the digest, and returns it so that
// its blob can be deleted; false when it is still named or absent.
func (q *Queries) DeleteUnusedTemplateImage(ctx context.Context, digest string) (img TemplateImage, deleted bool, err error) {
	err = q.atomically(ctx, func(q *Queries) error {
		var created int64
		err := q.writeQueryRow(ctx, "SELECT blob_key, size, bytes, entries, created_at FROM template_images WHERE digest = ?", digest).
			Scan(&img.BlobKey, &img.Size, &img.Bytes, &img.Entries, &created)
		if err != nil {
			if err = notFound(err); errors.Is(err, ErrNotFound) {
				return nil
			}
			return fmt.Errorf("delete template image %s: %w", digest, err)
		}
		img.Digest, img.CreatedAt = digest, fromMillis(created)
		n, err := q.execCount(ctx, "DELETE FROM template_images WHERE digest = ? AND NOT EXISTS (SELECT 1 FROM templates WHERE digest = ?)", digest, digest)
		if err != nil {
			return fmt.Errorf("delete template image %s: %w", digest, mapErr(err))
		}
		deleted = n == 1
		return nil
	})
	return img, deleted, err
}

// CountTemplatesWithDigest returns how many templates (any status) name
// the image digest: its cached root filesystem and its blob are needed
// while this is not zero.
func (q *Queries) CountTemplatesWithDigest(ctx context.Context, digest string) (int, error) {
	var n int
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM templates WHERE digest = ?", digest).Scan(&n); err != nil {
		return 0, fmt.Errorf("count templates of image %s: %w", digest, err)
	}
	return n, nil
}

// SetTemplateDigest records the image digest a building template's source
// resolved to, before its build fetches it, so that the image is known to
// be needed while the build runs; false when the template is gone or no
// longer building.
func (q *Queries) SetTemplateDigest(ctx context.Context, id, digest string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE templates SET digest = ?, updated_at = ? WHERE id = ? AND status = ?",
		digest, toMillis(nowMS()), id, TemplateBuilding)
	if err != nil {
		return false, fmt.Errorf("set the digest of template %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// TemplateBlobInUse reports whether a blob that was a template's layer is
// still named: by a template's layer chain, by an account's build cache
// (template_layers) or by a snapshot. Only a blob named by none may be
// deleted.
func (q *Queries) TemplateBlobInUse(ctx context.Context, blobKey string) (bool, error) {
	var n int
	err := q.queryRow(ctx, `SELECT (SELECT COUNT(*) FROM templates WHERE layers LIKE ?)
		+ (SELECT COUNT(*) FROM template_layers WHERE blob_key = ?)
		+ (SELECT COUNT(*) FROM snapshots WHERE blob_key = ?)
		+ (SELECT COUNT(*) FROM template_images WHERE blob_key = ?)`,
		`%"`+blobKey+`"%`, blobKey, blobKey, blobKey).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("count the users of blob %s: %w", blobKey, err)
	}
	return n > 0, nil
}

// ListTemplateImages returns every stored root filesystem's row, by digest.
func (q *Queries) ListTemplateImages(ctx context.Context) ([]TemplateImage, error) {
	out, err := queryAll(ctx, q, func(s scanner) (TemplateImage, error) {
		var img TemplateImage
		var created int64
		err := s.Scan(&img.Digest, &img.BlobKey, &img.Size, &img.Bytes, &img.Entries, &created)
		img.CreatedAt = fromMillis(created)
		return img, err
	}, "SELECT digest, blob_key, size, bytes, entries, created_at FROM template_images ORDER BY digest")
	if err != nil {
		return nil, fmt.Errorf("list template images: %w", err)
	}
	return out, nil
}

// UseTemplateLayer returns the account's cached layer of cacheKey, as
// GetTemplateLayer does, and records that a build takes it now, so that
// DeleteUnusedTemplateLayers spares it; ErrNotFound when there is none
// (or it was just collected: then the build runs the step).
func (q *Queries) UseTemplateLayer(ctx context.Context, accountID, cacheKey string) (TemplateLayer, error) {
	l := TemplateLayer{AccountID: accountID, CacheKey: cacheKey}
	var created int64
	err := q.writeQueryRow(ctx, "UPDATE template_layers SET used_at = ? WHERE account_id = ? AND cache_key = ? RETURNING blob_key, size, created_at",
		toMillis(nowMS()), accountID, cacheKey).Scan(&l.BlobKey, &l.Size, &created)
	if err != nil {
		return TemplateLayer{}, fmt.Errorf("use template layer %s: %w", cacheKey, notFound(err))
	}
	l.CreatedAt = fromMillis(created)
	return l, nil
}

// DeleteUnusedTemplateLayers deletes the build cache entries made and
// last taken before before that no template's layer chain names, and
// returns them (their blobs may then be deleted). An entry a build takes
// (UseTemplateLayer) at the same time is either spared or, deleted first,
// not found by the build.
func (q *Queries) DeleteUnusedTemplateLayers(ctx context.Context, before time.Time) ([]TemplateLayer, error) {
	var out []TemplateLayer
	err := q.atomically(ctx, func(q *Queries) error {
		var err error
		out, err = queryAll(ctx, q, func(s scanner) (TemplateLayer, error) {
			var l TemplateLayer
			var created int64
			err := s.Scan(&l.AccountID, &l.CacheKey, &l.BlobKey, &l.Size, &created)
			l.CreatedAt = fromMillis(created)
			return l, err
		}, `DELETE FROM template_layers WHERE used_at < ? AND created_at < ?
			AND NOT EXISTS (SELECT 1 FROM templates WHERE templates.layers LIKE '%"' || template_layers.blob_key || '"%')
			RETURNING account_id, cache_key, blob_key, size, created_at`, toMillis(before), toMillis(before))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("delete unused template layers: %w", err)
	}
	return out, nil
}
