package persist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Snapshot implements sandbox.Persistence.
func (s *Service) Snapshot(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (string, error) {
	snap, err := s.Capture(ctx, sb, rsb)
	return snap.ID, err
}

// Capture snapshots the sandbox's writable layer, records it (flattening a
// chain grown past MaxDepth) and makes it the account's snapshot.
//
// A sandbox from a custom template never writes its account's snapshot
// (docs/TEMPLATES.md): its layer sits on another root filesystem.
func (s *Service) Capture(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (store.Snapshot, error) {
	if sb.TemplateID != "" {
		return store.Snapshot{}, errdefs.New(errdefs.ErrInvalid, "a sandbox from a custom template does not write its account's snapshot")
	}
	var parent *store.Snapshot
	if sb.SnapshotID != "" {
		p, err := s.st.GetSnapshot(ctx, sb.SnapshotID)
		if err != nil {
			return store.Snapshot{}, fmt.Errorf("load parent snapshot: %w", err)
		}
		parent = &p
	}
	unlock := s.lockAccount(sb.AccountID)
	defer unlock()
	room, err := s.snapshotRoom(ctx, sb.AccountID)
	if err != nil {
		return store.Snapshot{}, err
	}
	pr, pw := io.Pipe()
	manifest := make(chan snapshot.Manifest, 1)
	go func() {
		m, err := rsb.Snapshot(ctx, pw)
		manifest <- m
		pw.CloseWithError(err)
	}()
	info, err := s.opts.Blobs.Put(ctx, s.quotaReader(pr, room))
	pr.CloseWithError(err)
	m := <-manifest
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("store snapshot of %s: %w", sb.ID, userFacing(err))
	}
	room -= info.Size
	snap := store.Snapshot{
		ID: store.NewID("snap_"), AccountID: sb.AccountID, BaseImage: m.BaseImage,
		BlobKey: info.Key, Size: info.Size, Depth: 1, SandboxID: sb.ID,
		CreatedAt: s.opts.Now(),
	}
	if parent != nil {
		snap.ParentID, snap.Depth = parent.ID, parent.Depth+1
	}
	layerKey := snap.BlobKey
	if snap.Depth > s.opts.MaxDepth {
		flat, err := s.flatten(ctx, snap, parent, room)
		if err != nil {
			s.dropBlob(ctx, layerKey)
			return store.Snapshot{}, userFacing(err)
		}
		snap = flat
	}
	if err := s.st.CreateSnapshot(ctx, &snap); err != nil {
		return store.Snapshot{}, fmt.Errorf("record snapshot: %w", err)
	}
	if snap.BlobKey != layerKey {
		// The flattened blob holds the layer: nothing refers to it alone.
		s.dropBlob(ctx, layerKey)
	}
	if err := s.setEnvironment(ctx, sb.AccountID, snap.ID); err != nil {
		return store.Snapshot{}, err
	}
	s.log.Info("snapshot taken", "sandbox_id", sb.ID, "snapshot_id", snap.ID, "bytes", snap.Size, "depth", snap.Depth, "files", m.Entries)
	s.collect(ctx)
	return snap, nil
}

// lockAccount serializes the captures of one account.
func (s *Service) lockAccount(accountID string) func() {
	s.mu.Lock()
	l, ok := s.captures[accountID]
	if !ok {
		l = &sync.Mutex{}
		s.captures[accountID] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// snapshotRoom is how many bytes of snapshot blobs the account may still
// store (-1: unlimited), after collecting what nothing refers to any more
// so that replaced and expired snapshots do not count.
func (s *Service) snapshotRoom(ctx context.Context, accountID string) (int64, error) {
	if s.opts.SnapshotQuota <= 0 {
		return -1, nil
	}
	s.collect(ctx)
	snaps, err := s.st.ListSnapshots(ctx, accountID)
	if err != nil {
		return 0, fmt.Errorf("list snapshots of %s: %w", accountID, err)
	}
	var used int64
	seen := map[string]bool{}
	for _, sn := range snaps {
		if !seen[sn.BlobKey] {
			seen[sn.BlobKey] = true
			used += sn.Size
		}
	}
	room := s.opts.SnapshotQuota - used
	if room <= 0 {
		return 0, s.quotaError(used)
	}
	return room, nil
}

func (s *Service) quotaError(used int64) error {
	return errdefs.New(nil, fmt.Sprintf("the account's snapshots would use more than its snapshot storage quota of %d MiB (%d MiB are stored); delete the environment (DELETE /api/sandboxes) or store less outside /workspace",
		s.opts.SnapshotQuota>>20, used>>20))
}

// quotaReader passes at most room bytes of r (all of it when room < 0)
// and fails with the quota error past that, so the blob is never stored.
func (s *Service) quotaReader(r io.Reader, room int64) io.Reader {
	if room < 0 {
		return r
	}
	return &quotaReader{r: r, left: room, err: func() error { return s.quotaError(s.opts.SnapshotQuota - room) }}
}

type quotaReader struct {
	r    io.Reader
	left int64
	err  func() error
}

func (q *quotaReader) Read(p []byte) (int, error) {
	if q.left <= 0 {
		var one [1]byte
		n, err := q.r.Read(one[:])
		if n > 0 {
			return 0, q.err()
		}
		return 0, err
	}
	if int64(len(p)) > q.left {
		p = p[:q.left]
	}
	n, err := q.r.Read(p)
	q.left -= int64(n)
	return n, err
}

// userFacing keeps only the user's message of err (and drops the context
// wrapped around it below, which may name host paths, such as the spool
// file of a refused blob) when it has one.
func userFacing(err error) error {
	var ue *errdefs.Error
	if errors.As(err, &ue) {
		return errdefs.Wrap(nil, err, ue.Msg)
	}
	return err
}

// dropBlob deletes a blob no snapshot refers to; best effort.
func (s *Service) dropBlob(ctx context.Context, key string) {
	if err := s.deleteBlobIfUnused(context.WithoutCancel(ctx), key); err != nil {
		s.log.Warn("delete unreferenced snapshot blob", "key", key, "err", err)
	}
}

// flatten merges snap's chain (parent's chain plus snap's own layer) into
// one layer with no parent, storing at most room bytes (< 0: unlimited).
func (s *Service) flatten(ctx context.Context, snap store.Snapshot, parent *store.Snapshot, room int64) (store.Snapshot, error) {
	chain, err := s.chain(ctx, parent)
	if err != nil {
		return snap, err
	}
	keys := append(chainKeys(chain), snap.BlobKey)
	readers := make([]io.Reader, 0, len(keys))
	for _, k := range keys {
		rc, err := s.opts.Blobs.Get(ctx, k)
		if err != nil {
			closeAll(readers)
			return snap, fmt.Errorf("open layer %s: %w", k, err)
		}
		readers = append(readers, rc)
	}
	defer closeAll(readers)
	pr, pw := io.Pipe()
	go func() {
		_, err := snapshot.Flatten(ctx, pw, readers, s.opts.BaseDir, s.opts.TempDir, snapshot.Manifest{BaseImage: snap.BaseImage}, s.opts.LayerBytes)
		pw.CloseWithError(err)
	}()
	info, err := s.opts.Blobs.Put(ctx, s.quotaReader(pr, room))
	pr.CloseWithError(err)
	if err != nil {
		return snap, fmt.Errorf("flatten %d layers: %w", len(keys), err)
	}
	s.log.Info("flattened snapshot chain", "layers", len(keys), "bytes", info.Size)
	snap.BlobKey, snap.Size, snap.ParentID, snap.Depth = info.Key, info.Size, "", 1
	return snap, nil
}

func closeAll(rs []io.Reader) {
	for _, r := range rs {
		if c, ok := r.(io.Closer); ok {
			c.Close()
		}
	}
}

// chain returns the snapshots from the bottom of the chain up to top.
func (s *Service) chain(ctx context.Context, top *store.Snapshot) ([]store.Snapshot, error) {
	var rev []store.Snapshot
	for cur := top; cur != nil; {
		rev = append(rev, *cur)
		if cur.ParentID == "" {
			break
		}
		if len(rev) > 4*s.opts.MaxDepth+16 {
			return nil, fmt.Errorf("snapshot chain of %s is too long", top.ID)
		}
		p, err := s.st.GetSnapshot(ctx, cur.ParentID)
		if err != nil {
			return nil, fmt.Errorf("load snapshot chain: %w", err)
		}
		cur = &p
	}
	out := make([]store.Snapshot, len(rev))
	for i, sn := range rev {
		out[len(rev)-1-i] = sn
	}
	return out, nil
}

func chainKeys(chain []store.Snapshot) []string {
	keys := make([]string, len(chain))
	for i, sn := range chain {
		keys[i] = sn.BlobKey
	}
	return keys
}

// Layers opens the chain of layers of the account's current snapshot,
// bottom first, or returns no layers when the account has none (or it
// expired). release closes what was opened.
func (s *Service) Layers(ctx context.Context, accountID string) ([]runtime.Layer, string, func(), error) {
	noop := func() {}
	env, err := s.st.GetEnvironment(ctx, accountID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (env.SnapshotID == nil || !env.ExpiresAt.After(s.opts.Now()))) {
		return nil, "", noop, nil
	}
	if err != nil {
		return nil, "", noop, fmt.Errorf("load environment of %s: %w", accountID, err)
	}
	top, err := s.st.GetSnapshot(ctx, *env.SnapshotID)
	if err != nil {
		return nil, "", noop, fmt.Errorf("load snapshot %s: %w", *env.SnapshotID, err)
	}
	chain, err := s.chain(ctx, &top)
	if err != nil {
		return nil, "", noop, err
	}
	var opened []io.Reader
	release := func() { closeAll(opened) }
	layers := make([]runtime.Layer, 0, len(chain))
	for _, sn := range chain {
		rc, err := s.opts.Blobs.Get(ctx, sn.BlobKey)
		if err != nil {
			release()
			return nil, "", noop, fmt.Errorf("open layer of snapshot %s: %w", sn.ID, err)
		}
		opened = append(opened, rc)
		layers = append(layers, runtime.Layer{ID: "sha256:" + sn.BlobKey, R: rc})
	}
	return layers, top.ID, release, nil
}
