package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// TemplateStatus is where a template's build is, as the API names it.
type TemplateStatus string

// Template statuses, as the API names them.
const (
	TemplateBuilding TemplateStatus = "building"
	TemplateReady    TemplateStatus = "ready"
	TemplateFailed   TemplateStatus = "failed"
)

// MaxTemplateLog bounds a template's build log: AppendTemplateLog keeps
// its last MaxTemplateLog bytes, cut at a line's start.
const MaxTemplateLog = 64 << 10

// Template is one template's row: a name and tag of an account (""
// for the operator's public templates), its source and, once built, what
// it was pinned to.
type Template struct {
	ID        string         `json:"id"` // tpl_...
	AccountID string         `json:"account_id"`
	Name      string         `json:"name"`
	Tag       string         `json:"tag"`
	Status    TemplateStatus `json:"status"`
	// Source is the image reference as it was asked for.
	Source string `json:"source"`
	// Digest is the image manifest's digest the source resolved to
	// ("" until built).
	Digest string `json:"digest,omitempty"`
	// Config is the image's config a sandbox takes, as JSON ("" until
	// built).
	Config string `json:"config,omitempty"`
	// FailureReason says why a failed build failed, for its user.
	FailureReason string `json:"failure_reason,omitempty"`
	// Log is the build's log, its last MaxTemplateLog bytes.
	Log string `json:"log,omitempty"`
	// NodeID is the node whose cache the build fills.
	NodeID string `json:"node_id,omitempty"`
	// Definition is the build's definition as JSON (steps or a
	// Dockerfile) for a template built with steps; "" for an image alone.
	Definition string `json:"definition,omitempty"`
	// Layers is the layer chain a sandbox from the template restores over
	// the image, a JSON array of blob keys, bottom first ("" for none).
	Layers string `json:"layers,omitempty"`
	// BuildID is the row of the build this row is a copy of, made when
	// the build took one more tag ("" for a build's own row: its ID).
	BuildID string `json:"build_id,omitempty"`
	// Kind is "" for a template and TemplateKindSnapshot for a named
	// snapshot of a sandbox's files (a template the lists of templates
	// leave out).
	Kind      string    `json:"kind,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// TemplateKindSnapshot is the Kind of a named snapshot.
const TemplateKindSnapshot = "snapshot"

// IsSnapshot reports whether t is a named snapshot.
func (t Template) IsSnapshot() bool { return t.Kind == TemplateKindSnapshot }

// kindName is how a message names a row of kind k.
func kindName(k string) string {
	if k == TemplateKindSnapshot {
		return "snapshot"
	}
	return "template"
}

const templateCols = "id, account_id, name, tag, status, source, digest, config, failure_reason, build_log, node_id, definition, layers, build_id, kind, created_at, updated_at"

func scanTemplate(s scanner) (Template, error) {
	var t Template
	var created, updated int64
	if err := s.Scan(&t.ID, &t.AccountID, &t.Name, &t.Tag, &t.Status, &t.Source, &t.Digest, &t.Config,
		&t.FailureReason, &t.Log, &t.NodeID, &t.Definition, &t.Layers, &t.BuildID, &t.Kind, &created, &updated); err != nil {
		return Template{}, err
	}
	t.CreatedAt, t.UpdatedAt = fromMillis(created), fromMillis(updated)
	return t, nil
}

// Build returns the id of the build t is a tag of: its BuildID, or its
// own ID.
func (t Template) Build() string {
	if t.BuildID != "" {
		return t.BuildID
	}
	return t.ID
}

// Waiting reports whether t is a build requested and not started yet
// (E2B's Template API requests a build before it sends its definition):
// building, with no source.
func (t Template) Waiting() bool { return t.Status == TemplateBuilding && t.Source == "" }

// Untagged reports whether t holds no tag (its Tag is UntaggedTag's): a
// build that takes its tags when ready, or one whose tag moved on.
func (t Template) Untagged() bool { return strings.HasPrefix(t.Tag, "~") }

// UntaggedTag is the tag of template id while it holds none: no name:tag
// a caller can write names it, and it is unique.
func UntaggedTag(id string) string { return "~" + id }

// CreateTemplate inserts t, filling an empty ID ("tpl_..."), an empty
// Status (building) and zero times. Another template of the same account,
// name and tag is ErrConflict. Source may be "" only for a building
// template (Waiting).
func (q *Queries) CreateTemplate(ctx context.Context, t *Template) error {
	if t == nil || t.Name == "" || t.Tag == "" || (t.Source == "" && t.Status != "" && t.Status != TemplateBuilding) {
		return fmt.Errorf("create template: %w: name, tag and source are required", ErrInvalid)
	}
	if t.ID == "" {
		t.ID = NewID("tpl_")
	}
	if t.Status == "" {
		t.Status = TemplateBuilding
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = nowMS()
	}
	t.CreatedAt = ms(t.CreatedAt)
	if t.UpdatedAt.IsZero() {
		t.UpdatedAt = t.CreatedAt
	}
	t.UpdatedAt = ms(t.UpdatedAt)
	_, err := q.exec(ctx, "INSERT INTO templates ("+templateCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		t.ID, t.AccountID, t.Name, t.Tag, t.Status, t.Source, t.Digest, t.Config, t.FailureReason, t.Log, t.NodeID,
		t.Definition, t.Layers, t.BuildID, t.Kind, toMillis(t.CreatedAt), toMillis(t.UpdatedAt))
	if err != nil {
		return fmt.Errorf("create template %s:%s: %w", t.Name, t.Tag, mapErr(err))
	}
	return nil
}

// GetTemplate returns the template with the given id.
func (q *Queries) GetTemplate(ctx context.Context, id string) (Template, error) {
	t, err := scanTemplate(q.queryRow(ctx, "SELECT "+templateCols+" FROM templates WHERE id = ?", id))
	if err != nil {
		return Template{}, fmt.Errorf("get template %s: %w", id, notFound(err))
	}
	return t, nil
}

// ListTemplates returns the account's templates and the public ones
// (account ""), by name and tag, the account's first; not the untagged
// ones (Untagged).
func (q *Queries) ListTemplates(ctx context.Context, accountID string) ([]Template, error) {
	out, err := queryAll(ctx, q, scanTemplate, "SELECT "+templateCols+
		" FROM templates WHERE (account_id = ? OR account_id = '') AND tag NOT LIKE '~%' ORDER BY CASE WHEN account_id = '' THEN 1 ELSE 0 END, name, tag, id", accountID)
	if err != nil {
		return nil, fmt.Errorf("list templates of %s: %w", accountID, err)
	}
	return out, nil
}

// FindTemplate returns the account's template name:tag, else the public
// one of that name and tag; ErrNotFound when neither exists.
func (q *Queries) FindTemplate(ctx context.Context, accountID, name, tag string) (Template, error) {
	t, err := scanTemplate(q.queryRow(ctx, "SELECT "+templateCols+
		" FROM templates WHERE (account_id = ? OR account_id = '') AND name = ? AND tag = ? ORDER BY CASE WHEN account_id = '' THEN 1 ELSE 0 END LIMIT 1",
		accountID, name, tag))
	if err != nil {
		return Template{}, fmt.Errorf("find template %s:%s: %w", name, tag, notFound(err))
	}
	return t, nil
}

// FinishTemplate ends a building template's build: ready with its digest
// and config, or failed with a reason, and deletes the build's sealed
// registry credentials (whatever it reports). It reports false when the template
// is gone or no longer building.
func (q *Queries) FinishTemplate(ctx context.Context, id string, status TemplateStatus, digest, config, reason string) (bool, error) {
	if status != TemplateReady && status != TemplateFailed {
		return false, fmt.Errorf("finish template %s: %w: status %q", id, ErrInvalid, status)
	}
	var n int64
	err := q.atomically(ctx, func(q *Queries) error {
		var err error
		n, err = q.execCount(ctx, "UPDATE templates SET status = ?, digest = ?, config = ?, failure_reason = ?, updated_at = ? WHERE id = ? AND status = ?",
			status, digest, config, reason, toMillis(nowMS()), id, TemplateBuilding)
		if err != nil {
			return mapErr(err)
		}
		// The build's registry credentials end with it.
		return q.DeleteTemplateCredentials(ctx, id)
	})
	if err != nil {
		return false, fmt.Errorf("finish template %s: %w", id, err)
	}
	return n == 1, nil
}

// SetTemplateLayers records the layer chain (JSON) of a building
// template, before FinishTemplate makes it ready; false when it is gone or
// no longer building.
func (q *Queries) SetTemplateLayers(ctx context.Context, id, layers string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE templates SET layers = ?, updated_at = ? WHERE id = ? AND status = ?",
		layers, toMillis(nowMS()), id, TemplateBuilding)
	if err != nil {
		return false, fmt.Errorf("set the layers of template %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// TemplateLayer is one entry of the template build cache: the layer a
// step made (a blob), by the step's cache key, per account; or, under the
// key "files/<hash>", an archive of build files the account uploaded for
// COPY steps (package templates' files.go).
type TemplateLayer struct {
	AccountID string
	CacheKey  string
	BlobKey   string
	Size      int64
	CreatedAt time.Time
}

// GetTemplateLayer returns the account's cached layer of cacheKey, or
// ErrNotFound.
func (q *Queries) GetTemplateLayer(ctx context.Context, accountID, cacheKey string) (TemplateLayer, error) {
	l := TemplateLayer{AccountID: accountID, CacheKey: cacheKey}
	var created int64
	err := q.queryRow(ctx, "SELECT blob_key, size, created_at FROM template_layers WHERE account_id = ? AND cache_key = ?",
		accountID, cacheKey).Scan(&l.BlobKey, &l.Size, &created)
	if err != nil {
		return TemplateLayer{}, fmt.Errorf("get template layer %s: %w", cacheKey, notFound(err))
	}
	l.CreatedAt = fromMillis(created)
	return l, nil
}

// PutTemplateLayer records l in the cache, replacing the account's entry
// of the same key (a forced rebuild).
func (q *Queries) PutTemplateLayer(ctx context.Context, l TemplateLayer) error {
	if l.AccountID == "" || l.CacheKey == "" || l.BlobKey == "" {
		return fmt.Errorf("put template layer: %w: account, cache key and blob key are required", ErrInvalid)
	}
	if l.CreatedAt.IsZero() {
		l.CreatedAt = nowMS()
	}
	_, err := q.exec(ctx, `INSERT INTO template_layers (account_id, cache_key, blob_key, size, created_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (account_id, cache_key) DO UPDATE SET blob_key = excluded.blob_key, size = excluded.size, created_at = excluded.created_at`,
		l.AccountID, l.CacheKey, l.BlobKey, l.Size, toMillis(l.CreatedAt))
	if err != nil {
		return fmt.Errorf("put template layer %s: %w", l.CacheKey, mapErr(err))
	}
	return nil
}

// AppendTemplateLog adds text to the template's build log, keeping its
// last MaxTemplateLog bytes (from a line's start). A template that is gone
// is ErrNotFound.
func (q *Queries) AppendTemplateLog(ctx context.Context, id, text string) error {
	return q.atomically(ctx, func(q *Queries) error {
		var cur string
		if err := q.writeQueryRow(ctx, "SELECT build_log FROM templates WHERE id = ?", id).Scan(&cur); err != nil {
			return fmt.Errorf("append to the log of template %s: %w", id, notFound(err))
		}
		next := cur + text
		if len(next) > MaxTemplateLog {
			next = next[len(next)-MaxTemplateLog:]
			if i := strings.IndexByte(next, '\n'); i >= 0 && i < len(next)-1 {
				next = next[i+1:]
			}
		}
		if _, err := q.exec(ctx, "UPDATE templates SET build_log = ?, updated_at = ? WHERE id = ?", next, toMillis(nowMS()), id); err != nil {
			return fmt.Errorf("append to the log of template %s: %w", id, err)
		}
		return nil
	})
}

// DeleteTemplate deletes template id unless a live sandbox (pending,
// running, paused or stopping) started from it: then ErrConflict. It
// reports whether another template still names its digest (the cached
// root filesystem is still needed). A template that is gone is
// ErrNotFound.
func (q *Queries) DeleteTemplate(ctx context.Context, id string) (digestInUse bool, err error) {
	err = q.atomically(ctx, func(q *Queries) error {
		var digest string
		if err := q.writeQueryRow(ctx, "SELECT digest FROM templates WHERE id = ?", id).Scan(&digest); err != nil {
			return fmt.Errorf("delete template %s: %w", id, notFound(err))
		}
		in, args := inList(activeSandboxStatuses)
		var live int
		if err := q.writeQueryRow(ctx, "SELECT COUNT(*) FROM sandboxes WHERE template_id = ? AND status IN ("+in+")",
			append([]any{id}, args...)...).Scan(&live); err != nil {
			return fmt.Errorf("delete template %s: count its sandboxes: %w", id, err)
		}
		if live > 0 {
			return fmt.Errorf("delete template %s: %w: %d live sandboxes started from it", id, ErrConflict, live)
		}
		if _, err := q.exec(ctx, "DELETE FROM templates WHERE id = ?", id); err != nil {
			return fmt.Errorf("delete template %s: %w", id, mapDeleteErr(err))
		}
		if err := q.DeleteTemplateCredentials(ctx, id); err != nil {
			return err
		}
		if digest == "" {
			return nil
		}
		var others int
		if err := q.writeQueryRow(ctx, "SELECT COUNT(*) FROM templates WHERE digest = ?", digest).Scan(&others); err != nil {
			return fmt.Errorf("delete template %s: count the templates of its image: %w", id, err)
		}
		digestInUse = others > 0
		return nil
	})
	return digestInUse, err
}

// ListBuildingTemplates returns the templates whose build on node has
// not ended, oldest first.
func (q *Queries) ListBuildingTemplates(ctx context.Context, nodeID string) ([]Template, error) {
	out, err := queryAll(ctx, q, scanTemplate, "SELECT "+templateCols+" FROM templates WHERE status = ? AND node_id = ? ORDER BY created_at, id",
		TemplateBuilding, nodeID)
	if err != nil {
		return nil, fmt.Errorf("list building templates of %s: %w", nodeID, err)
	}
	return out, nil
}

// StartTemplate gives a waiting template (Waiting) its source, digest
// (a template built over another names its parent's from the start; ""
// for an image, until built) and definition, and the node that builds
// it: its build can run. It reports false when the template is gone or
// not waiting.
func (q *Queries) StartTemplate(ctx context.Context, id, source, digest, definition, nodeID string) (bool, error) {
	if source == "" {
		return false, fmt.Errorf("start template %s: %w: a source is required", id, ErrInvalid)
	}
	n, err := q.execCount(ctx, "UPDATE templates SET source = ?, digest = ?, definition = ?, node_id = ?, updated_at = ? WHERE id = ? AND status = ? AND source = ''",
		source, digest, definition, nodeID, toMillis(nowMS()), id, TemplateBuilding)
	if err != nil {
		return false, fmt.Errorf("start template %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// TagTemplate makes the ready template id's build hold tag (of its name),
// in one transaction: the row that held it loses it (becomes Untagged,
// returned as moved; ID "" when none did); then an untagged id takes the
// tag itself, and a tagged one gets a copy under it (BuildID its build).
// held is the row that holds the tag after. A template that is not ready
// is ErrConflict; one that is gone ErrNotFound.
func (q *Queries) TagTemplate(ctx context.Context, id, tag string) (held, moved Template, err error) {
	err = q.atomically(ctx, func(q *Queries) error {
		self, err := scanTemplate(q.writeQueryRow(ctx, "SELECT "+templateCols+" FROM templates WHERE id = ?", id))
		if err != nil {
			return fmt.Errorf("tag template %s: %w", id, notFound(err))
		}
		if self.Status != TemplateReady {
			return fmt.Errorf("tag template %s: %w: it is %s", id, ErrConflict, self.Status)
		}
		if self.Tag == tag {
			held = self
			return nil
		}
		cur, err := scanTemplate(q.writeQueryRow(ctx, "SELECT "+templateCols+" FROM templates WHERE account_id = ? AND name = ? AND tag = ?",
			self.AccountID, self.Name, tag))
		switch {
		case err == nil && cur.Kind != self.Kind:
			// A template's name:tag is never a snapshot's, nor the other
			// way round (checked here, where the move is made).
			return fmt.Errorf("tag template %s: %w: %s:%s is held by a %s", id, ErrConflict, cur.Name, tag, kindName(cur.Kind))
		case err == nil:
			if _, err := q.exec(ctx, "UPDATE templates SET tag = ?, updated_at = ? WHERE id = ?", UntaggedTag(cur.ID), toMillis(nowMS()), cur.ID); err != nil {
				return fmt.Errorf("tag template %s: untag %s: %w", id, cur.ID, mapErr(err))
			}
			moved = cur
			moved.Tag = UntaggedTag(cur.ID)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("tag template %s: %w", id, err)
		}
		if self.Untagged() {
			if _, err := q.exec(ctx, "UPDATE templates SET tag = ?, updated_at = ? WHERE id = ?", tag, toMillis(nowMS()), id); err != nil {
				return fmt.Errorf("tag template %s: %w", id, mapErr(err))
			}
			held = self
			held.Tag = tag
			return nil
		}
		c := self
		c.ID, c.Tag, c.BuildID, c.CreatedAt, c.UpdatedAt = "", tag, self.Build(), time.Time{}, time.Time{}
		if err := q.CreateTemplate(ctx, &c); err != nil {
			return err
		}
		held = c
		return nil
	})
	return held, moved, err
}

// UntagTemplate takes tag from the account's template name:tag, which
// stays (Untagged) for the sandboxes that run it until collected. None
// with that name and tag is ErrNotFound.
func (q *Queries) UntagTemplate(ctx context.Context, accountID, name, tag string) (Template, error) {
	var t Template
	err := q.atomically(ctx, func(q *Queries) error {
		var err error
		t, err = scanTemplate(q.writeQueryRow(ctx, "SELECT "+templateCols+" FROM templates WHERE account_id = ? AND name = ? AND tag = ?", accountID, name, tag))
		if err != nil {
			return fmt.Errorf("untag template %s:%s: %w", name, tag, notFound(err))
		}
		t.Tag = UntaggedTag(t.ID)
		if _, err := q.exec(ctx, "UPDATE templates SET tag = ?, updated_at = ? WHERE id = ?", t.Tag, toMillis(nowMS()), t.ID); err != nil {
			return fmt.Errorf("untag template %s:%s: %w", name, tag, mapErr(err))
		}
		return nil
	})
	return t, err
}

// ListStrayTemplates returns what a collection looks at: the untagged
// templates and the waiting ones (Waiting), of every account, oldest
// first.
func (q *Queries) ListStrayTemplates(ctx context.Context) ([]Template, error) {
	out, err := queryAll(ctx, q, scanTemplate, "SELECT "+templateCols+" FROM templates WHERE tag LIKE '~%' OR (status = ? AND source = '') ORDER BY created_at, id",
		TemplateBuilding)
	if err != nil {
		return nil, fmt.Errorf("list stray templates: %w", err)
	}
	return out, nil
}

// CountTemplatesWithBlob returns how many templates name blobKey in their
// layer chain, and how many build cache entries hold it. A template's
// chain may hold an account's snapshot layers (a template saved from a
// sandbox on the built-in image), so the snapshots' garbage collection
// deletes a blob only when this is zero too.
func (q *Queries) CountTemplatesWithBlob(ctx context.Context, blobKey string) (int, error) {
	if blobKey == "" || strings.ContainsAny(blobKey, `"%_\`) {
		// Blob keys are hex; anything else could not be named by a
		// chain, and must not become a LIKE pattern.
		return 0, fmt.Errorf("count templates of blob %q: %w: not a blob key", blobKey, ErrInvalid)
	}
	var n, cached int
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM templates WHERE layers LIKE ?", `%"`+blobKey+`"%`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count templates of blob %s: %w", blobKey, err)
	}
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM template_layers WHERE blob_key = ?", blobKey).Scan(&cached); err != nil {
		return 0, fmt.Errorf("count cached layers of blob %s: %w", blobKey, err)
	}
	return n + cached, nil
}

// PutTemplateCredentials records the sealed registry credentials of
// template id's build, replacing any of an earlier build of the same row
// (package templates seals them; the store never sees them in the clear).
func (q *Queries) PutTemplateCredentials(ctx context.Context, id, sealed string) error {
	if id == "" || sealed == "" {
		return fmt.Errorf("put template credentials: %w: id and sealed credentials are required", ErrInvalid)
	}
	if _, err := q.exec(ctx, `INSERT INTO template_credentials (template_id, sealed, created_at) VALUES (?, ?, ?)
		ON CONFLICT (template_id) DO UPDATE SET sealed = excluded.sealed, created_at = excluded.created_at`,
		id, sealed, toMillis(nowMS())); err != nil {
		return fmt.Errorf("put the credentials of template %s: %w", id, mapErr(err))
	}
	return nil
}

// GetTemplateCredentials returns the sealed registry credentials of
// template id's build, or ErrNotFound when it has none (an anonymous
// pull, or the build ended).
func (q *Queries) GetTemplateCredentials(ctx context.Context, id string) (string, error) {
	var sealed string
	if err := q.queryRow(ctx, "SELECT sealed FROM template_credentials WHERE template_id = ?", id).Scan(&sealed); err != nil {
		return "", fmt.Errorf("get the credentials of template %s: %w", id, notFound(err))
	}
	return sealed, nil
}

// DeleteTemplateCredentials deletes the sealed credentials of template id
// (none is not an error).
func (q *Queries) DeleteTemplateCredentials(ctx context.Context, id string) error {
	if _, err := q.exec(ctx, "DELETE FROM template_credentials WHERE template_id = ?", id); err != nil {
		return fmt.Errorf("delete the credentials of template %s: %w", id, err)
	}
	return nil
}

// DeleteStaleTemplateCredentials deletes the sealed credentials of every
// template that is not building (ended, or gone): a backstop for a row
// ended or deleted by a way other than FinishTemplate and DeleteTemplate,
// which delete them in their own transaction.
func (q *Queries) DeleteStaleTemplateCredentials(ctx context.Context) (int64, error) {
	n, err := q.execCount(ctx, "DELETE FROM template_credentials WHERE template_id NOT IN (SELECT id FROM templates WHERE status = ?)", TemplateBuilding)
	if err != nil {
		return 0, fmt.Errorf("delete stale template credentials: %w", err)
	}
	return n, nil
}
