package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// SandboxSaver captures running sandboxes' files for templates; package
// sandbox's Manager is one.
type SandboxSaver interface {
	// SandboxToSave loads sandbox id for p under the one access rule
	// (another account's is not found) and refuses, with the reason, one
	// that cannot be saved now: not running, not on this node, a fork.
	SandboxToSave(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	// CaptureFiles writes the writable layer of sandbox sb, which must
	// still be running here, to w in the snapshot format (the runtime's
	// Snapshot, as an account's snapshot is captured).
	CaptureFiles(ctx context.Context, sb store.Sandbox, w io.Writer) (snapshot.Manifest, error)
}

// maxSnapshotChain bounds the walk down an account's snapshot chain
// (persist flattens chains far shorter).
const maxSnapshotChain = 1000

// FromSandbox saves running sandbox sandboxID's files as template name
// ("name[:tag]") of the sandbox's account, and answers it ready. Its
// writable layer is captured (memory is not) and stored in the blob
// store; the template's base is the sandbox's: its template (that
// template's image, layers, config and start and ready commands) or the
// built-in image with the account's snapshot layers the sandbox started
// from. The template's row names its whole chain from the start, which
// keeps the snapshots' garbage collection off those layers. A template
// of that name and tag is a conflict.
func (s *Service) FromSandbox(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error) {
	if name == "" {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "name: required")
	}
	ref, err := templatespec.ParseRef(name)
	if err != nil {
		return store.Template{}, err
	}
	return s.saveSandbox(ctx, p, sandboxID, store.Template{Name: ref.Name, Tag: ref.Tag})
}

// saveSandbox saves running sandbox sandboxID's files as row t (its name,
// tag and kind; the rest is filled) of the sandbox's account, and answers
// it ready (FromSandbox). A snapshot (t.Kind) is saved untagged, for
// Snapshot to give it t.Tag. A row that fails to save is deleted.
func (s *Service) saveSandbox(ctx context.Context, p auth.Principal, sandboxID string, t store.Template) (store.Template, error) {
	if s.cfg.Saver == nil || s.cfg.Blobs == nil {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "this server cannot save sandboxes' files (no sandbox runtime or blob store)")
	}
	sb, err := s.cfg.Saver.SandboxToSave(ctx, p, sandboxID)
	if err != nil {
		return store.Template{}, err
	}
	return s.save(ctx, sb, t)
}

// SavePausedFiles saves the files of sandbox sb, which a pause of its
// files alone is ending on this node (package sandbox checked the access
// and the state), as an untagged snapshot: no list shows it, its row
// keeps it while the sandbox lives (its template from then on), and it is
// collected as any stray once the sandbox ends.
func (s *Service) SavePausedFiles(ctx context.Context, sb store.Sandbox) (store.Template, error) {
	if s.cfg.Blobs == nil {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "this server cannot save sandboxes' files (no blob store)")
	}
	id := store.NewID("tpl_")
	return s.save(ctx, sb, store.Template{ID: id, Name: id, Tag: templatespec.DefaultTag, Kind: store.TemplateKindSnapshot})
}

// save is saveSandbox of sandbox sb, loaded and checked.
func (s *Service) save(ctx context.Context, sb store.Sandbox, t store.Template) (store.Template, error) {
	b, def, err := s.sandboxBase(ctx, sb)
	if err != nil {
		return store.Template{}, err
	}
	chain, err := json.Marshal(b.layers)
	if err != nil {
		return store.Template{}, err
	}
	defJSON, err := json.Marshal(def)
	if err != nil {
		return store.Template{}, err
	}
	what := "template"
	if t.IsSnapshot() {
		what = "snapshot"
		// A snapshot replaces one of its name and tag, never a
		// template: checked before the capture, for a clear answer.
		cur, err := s.st.FindTemplate(ctx, sb.AccountID, t.Name, t.Tag)
		if err == nil && cur.AccountID == sb.AccountID && !cur.IsSnapshot() {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "%s:%s is a template of the account, not a snapshot; choose another name", cur.Name, cur.Tag)
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.Template{}, err
		}
		// Saved untagged; Snapshot gives it the tag once it is ready.
		if t.ID == "" {
			t.ID = store.NewID("tpl_")
		}
		t.Tag = store.UntaggedTag(t.ID)
	}
	t.AccountID, t.Source, t.Status, t.NodeID, t.Digest = sb.AccountID, "sandbox:"+sb.ID, store.TemplateBuilding, s.cfg.NodeID, b.digest
	t.Definition, t.Layers = string(defJSON), string(chain)
	t.Log = logLine("saving sandbox %s as %s %s (%s)", sb.ID, what, t.Name, b.what)
	if len(b.layers) == 0 {
		t.Layers = ""
	}
	if err := s.st.CreateTemplate(ctx, &t); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s:%s exists; delete it first or choose another tag", t.Name, t.Tag)
		}
		return store.Template{}, fmt.Errorf("record %s: %w", what, err)
	}
	layers, size, err := s.capture(ctx, t, sb, b)
	if err != nil {
		// Nothing was made: the row goes, so that the name is free
		// again.
		if _, derr := s.st.DeleteTemplate(context.WithoutCancel(ctx), t.ID); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			s.log.Warn("templates: delete a template whose save failed", "template_id", t.ID, "err", derr)
		}
		return store.Template{}, err
	}
	chain, err = json.Marshal(layers)
	if err != nil {
		return store.Template{}, err
	}
	cfg, err := json.Marshal(b.config)
	if err != nil {
		return store.Template{}, err
	}
	wctx := context.WithoutCancel(ctx)
	if _, err := s.st.SetTemplateLayers(wctx, t.ID, string(chain)); err != nil {
		return store.Template{}, err
	}
	if err := s.st.AppendTemplateLog(wctx, t.ID, logLine("saved: layer %s, %d bytes", short(layers[len(layers)-1]), size)); err != nil {
		return store.Template{}, err
	}
	ok, err := s.st.FinishTemplate(wctx, t.ID, store.TemplateReady, b.digest, string(cfg), "")
	if err != nil {
		return store.Template{}, err
	}
	if !ok {
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "the %s was deleted while the sandbox was saved", what)
	}
	s.log.Info("templates: sandbox saved", "kind", what, "template_id", t.ID, "sandbox_id", sb.ID, "bytes", size)
	return s.st.GetTemplate(wctx, t.ID)
}

// sandboxBase is what a template saved from sb stands on: sb's template
// as it is, or the built-in image with the chain of the account's
// snapshot sb started from; and the definition the template records.
func (s *Service) sandboxBase(ctx context.Context, sb store.Sandbox) (base, definition, error) {
	def := definition{Sandbox: sb.ID}
	if sb.TemplateID != "" {
		// A live sandbox's template cannot be deleted (Delete refuses),
		// nor does a ready one change.
		t, err := s.st.GetTemplate(ctx, sb.TemplateID)
		if err != nil {
			return base{}, def, fmt.Errorf("the sandbox's template: %w", err)
		}
		img, err := s.catalog.image(ctx, t)
		if err != nil {
			return base{}, def, err
		}
		def.StartCmd, def.ReadyCmd = img.StartCmd, img.ReadyCmd
		return base{digest: t.Digest, dir: img.RootFS, image: img.BaseImage, config: img.Config, layers: slices.Clone(img.Layers),
			what: "over template " + img.Ref}, def, nil
	}
	bi := s.catalog.builtin
	if bi.ID == "" || bi.Dir == "" {
		return base{}, def, errdefs.New(errdefs.ErrInvalid, "this server cannot save sandboxes of its built-in image as templates")
	}
	var chain []string
	for id, n := sb.SnapshotID, 0; id != ""; n++ {
		if n == maxSnapshotChain {
			return base{}, def, fmt.Errorf("snapshot %s: a chain deeper than %d", sb.SnapshotID, maxSnapshotChain)
		}
		sn, err := s.st.GetSnapshot(ctx, id)
		if err != nil {
			return base{}, def, fmt.Errorf("the snapshot the sandbox started from: %w", err)
		}
		if sn.BaseImage != bi.ID {
			return base{}, def, errdefs.New(errdefs.ErrConflict, "the sandbox started from a snapshot of another built-in image than this server's; it cannot be saved as a template")
		}
		chain = append(chain, sn.BlobKey)
		id = sn.ParentID
	}
	slices.Reverse(chain)
	return base{digest: BuiltinDigest(bi.ID), dir: bi.Dir, image: bi.ID, layers: chain, what: "over the built-in image"}, def, nil
}

// capture stores sb's writable layer in the blob store and checks that it
// sits where t's chain says (the sandbox's base image, over its last
// layer): the template's chain, the new layer last, and its size.
func (s *Service) capture(ctx context.Context, t store.Template, sb store.Sandbox, b base) ([]string, int64, error) {
	for _, k := range b.layers {
		if _, err := s.cfg.Blobs.Stat(ctx, k); err != nil {
			if errors.Is(err, blob.ErrNotFound) {
				return nil, 0, errdefs.Wrap(errdefs.ErrConflict, err, fmt.Sprintf("a layer the sandbox started from (%s) is gone from the blob store", short(k)))
			}
			return nil, 0, err
		}
	}
	pr, pw := io.Pipe()
	manifest := make(chan snapshot.Manifest, 1)
	go func() {
		m, err := s.cfg.Saver.CaptureFiles(ctx, sb, pw)
		manifest <- m
		pw.CloseWithError(err)
	}()
	info, err := s.cfg.Blobs.Put(ctx, pr)
	pr.CloseWithError(err)
	m := <-manifest
	if err != nil {
		if ue := (*errdefs.Error)(nil); errors.As(err, &ue) || errors.Is(err, errdefs.ErrNotRunning) {
			return nil, 0, err
		}
		return nil, 0, errdefs.Wrap(nil, err, "the sandbox's files could not be saved")
	}
	want := ""
	if n := len(b.layers); n > 0 {
		want = "sha256:" + b.layers[n-1]
	}
	if m.BaseImage != b.image || m.Parent != want {
		s.dropBlob(ctx, info.Key)
		return nil, 0, errdefs.Newf(errdefs.ErrConflict, "the sandbox's files do not sit on the layers it started from (a fork, or a sandbox restored another way); it cannot be saved as a template")
	}
	return append(slices.Clone(b.layers), info.Key), info.Size, nil
}

// dropBlob deletes a layer no template nor snapshot names; best effort.
func (s *Service) dropBlob(ctx context.Context, key string) {
	ctx = context.WithoutCancel(ctx)
	n, err := s.st.CountTemplatesWithBlob(ctx, key)
	if err == nil && n == 0 {
		n, err = s.st.CountSnapshotsWithBlob(ctx, key)
	}
	if err == nil && n == 0 {
		err = s.cfg.Blobs.Delete(ctx, key)
	}
	if err != nil {
		s.log.Warn("templates: drop an unused layer", "key", key, "err", err)
	}
}
