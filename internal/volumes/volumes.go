// Package volumes owns an account's named persistent volumes: ext4 disk
// images that outlive every sandbox, mounted into sandboxes at create
// (runtime.VolumeMount), resized, forked and deleted through the API.
//
// A volume's row (store.Volume) says where its newest data is: the local
// image of one node (DataNode), or the blob store's compressed copy
// (BlobKey, of Generation). On one node the image stays on its disk, in
// Dir, and survives restarts. In a cluster (Config.Sync) the node that
// wrote it uploads it when the writer detaches, and a node that attaches
// it downloads the copy unless its own is of the same generation: a
// volume follows its sandboxes to any node.
//
// Its leases are store.VolumeAttachment rows, recorded with the sandbox's
// row (or refused with it): one read-write attachment, or any number of
// read-only ones. The Hook mounts them as the sandbox starts and, when it
// ends, syncs what it wrote and releases them. A sandbox paused with its
// files alone keeps its leases (its volumes' data synced at the pause).
//
// Trust: the gVisor backend mounts an image with the host's kernel, so an
// image is only ever written by a host kernel there. A microVM gets the
// image as a disk its own kernel writes as it likes; such a volume is
// marked guest-written and is never again given to a gVisor sandbox
// (409), nor grown on the host.
package volumes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Sizes of volumes.
const (
	MiB         = 1 << 20
	GiB         = 1 << 30
	DefaultSize = 1 * GiB
	MinSize     = 64 * MiB
)

// Limits bound an account's volumes; 0 is unlimited.
type Limits struct {
	Count    int   // volumes an account may have
	Bytes    int64 // their sizes summed
	MaxBytes int64 // one volume's size
}

// DefaultLimits are a server's unless its operator says otherwise.
var DefaultLimits = Limits{Count: 20, Bytes: 100 * GiB, MaxBytes: 50 * GiB}

// Config is what a Service needs.
type Config struct {
	Store *store.Store
	// Blobs holds the volumes' copies when Sync is set.
	Blobs blob.Store
	// Sync: the server is a node of a cluster sharing Blobs; a writer's
	// detach uploads the image, an attach on another node downloads it.
	Sync bool
	// NodeID is this node's id (the sandboxes' node_id).
	NodeID string
	// Dir holds this node's volume images.
	Dir string
	// Runtime is this node's runtime's name: "gvisor" may not mount a
	// guest-written image.
	Runtime string
	Limits  Limits
	Logger  *slog.Logger
}

// Service manages the volumes; it is also the Hook that attaches them to
// sandboxes on this node.
type Service struct {
	cfg Config
	st  *store.Store
	log *slog.Logger

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per volume id: this node's image of it
}

// New returns a Service; it makes Dir.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, errors.New("volumes: Store and Dir are required")
	}
	if cfg.Sync && cfg.Blobs == nil {
		return nil, errors.New("volumes: Sync needs Blobs")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	return &Service{cfg: cfg, st: cfg.Store, log: cfg.Logger.With("component", "volumes"), locks: map[string]*sync.Mutex{}}, nil
}

// Info is a volume with the sandboxes it is attached to.
type Info struct {
	store.Volume
	Attachments []store.VolumeAttachment
}

// namePattern is what a volume's name may be.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// idPrefix starts every volume id.
const idPrefix = "vol_"

func checkName(name string) error {
	if !namePattern.MatchString(name) || strings.HasPrefix(name, idPrefix) {
		return errdefs.Newf(errdefs.ErrInvalid, "volume name %q: want 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit (and not with %q)", name, idPrefix)
	}
	return nil
}

// checkSize refuses a size outside [MinSize, Limits.MaxBytes] or not a
// whole number of MiB.
func (s *Service) checkSize(size int64) error {
	if size < MinSize || size%MiB != 0 {
		return errdefs.Newf(errdefs.ErrInvalid, "volume size %d bytes: want a whole number of MiB, at least %d MiB", size, MinSize/MiB)
	}
	if max := s.cfg.Limits.MaxBytes; max > 0 && size > max {
		return errdefs.Newf(errdefs.ErrInvalid, "volume size %d MiB: at most %d MiB on this server", size/MiB, max/MiB)
	}
	return nil
}

func (s *Service) storeLimits() store.VolumeLimits {
	return store.VolumeLimits{Count: s.cfg.Limits.Count, Bytes: s.cfg.Limits.Bytes}
}

// Create makes account's volume name of size bytes (0: DefaultSize). Its
// disk is made at its first attach, on the node that attaches it.
func (s *Service) Create(ctx context.Context, account, name string, size int64) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	if size == 0 {
		size = DefaultSize
	}
	if err := s.checkSize(size); err != nil {
		return Info{}, err
	}
	v := store.Volume{ID: store.NewID(idPrefix), AccountID: account, Name: name, SizeBytes: size}
	if err := s.st.CreateVolumeWithin(ctx, &v, s.storeLimits()); err != nil {
		return Info{}, s.storeError(err, name)
	}
	s.log.Info("volume created", "volume_id", v.ID, "account_id", account, "name", name, "size_bytes", size)
	return Info{Volume: v}, nil
}

// storeError turns the store's errors about volume name into the API's.
func (s *Service) storeError(err error, name string) error {
	var busy *store.VolumeBusyError
	var qe *store.QuotaError
	switch {
	case errors.As(err, &busy):
		return errdefs.New(errdefs.ErrConflict, busy.Error())
	case errors.As(err, &qe) && qe.Scope == "volumes":
		return errdefs.Newf(errdefs.ErrQuota, "the account has %d volumes, the limit is %d; delete one first", qe.Count, qe.Limit)
	case errors.As(err, &qe):
		return errdefs.Newf(errdefs.ErrQuota, "the account's volumes would take more than %d MiB (they take %d MiB)", int64(qe.Limit)/MiB, int64(qe.Count)/MiB)
	case errors.Is(err, store.ErrConflict):
		return errdefs.Newf(errdefs.ErrConflict, "the account has a volume called %q", name)
	case errors.Is(err, store.ErrNotFound):
		return errdefs.Newf(errdefs.ErrNotFound, "volume %q not found", name)
	}
	return err
}

// lookup finds account's volume by name or id; another account's is not
// found.
func (s *Service) lookup(ctx context.Context, account, ref string) (store.Volume, error) {
	var v store.Volume
	var err error
	if strings.HasPrefix(ref, idPrefix) {
		v, err = s.st.GetVolume(ctx, ref)
		if err == nil && v.AccountID != account {
			err = store.ErrNotFound
		}
	} else {
		v, err = s.st.GetVolumeByName(ctx, account, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return v, errdefs.Newf(errdefs.ErrNotFound, "volume %q not found", ref)
	}
	return v, err
}

func (s *Service) info(ctx context.Context, v store.Volume) (Info, error) {
	atts, err := s.st.VolumeAttachments(ctx, v.ID)
	return Info{Volume: v, Attachments: atts}, err
}

// Get answers account's volume ref (its name or id).
func (s *Service) Get(ctx context.Context, account, ref string) (Info, error) {
	v, err := s.lookup(ctx, account, ref)
	if err != nil {
		return Info{}, err
	}
	return s.info(ctx, v)
}

// List answers account's volumes by name.
func (s *Service) List(ctx context.Context, account string) ([]Info, error) {
	vs, err := s.st.ListVolumes(ctx, account)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(vs))
	for _, v := range vs {
		i, err := s.info(ctx, v)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, nil
}

// Delete deletes account's volume ref and its data (this node's image,
// the blob store's copy); 409 while it is attached. Another node's image
// of it goes at that node's next start (Reconcile).
func (s *Service) Delete(ctx context.Context, account, ref string) (Info, error) {
	v, err := s.lookup(ctx, account, ref)
	if err != nil {
		return Info{}, err
	}
	if v, err = s.st.DeleteVolume(ctx, v.ID); err != nil {
		return Info{}, s.storeError(err, ref)
	}
	unlock := s.lock(v.ID)
	s.removeLocal(v.ID)
	unlock()
	s.collectBlob(ctx, v.BlobKey)
	s.log.Info("volume deleted", "volume_id", v.ID, "account_id", account, "name", v.Name)
	return Info{Volume: v}, nil
}

// Resize makes account's volume ref size bytes: it only grows (ext4 grows
// while mounted, shrinking would need the whole disk rewritten), and not
// while attached (409). Its file system grows at its next attach.
func (s *Service) Resize(ctx context.Context, account, ref string, size int64) (Info, error) {
	v, err := s.lookup(ctx, account, ref)
	if err != nil {
		return Info{}, err
	}
	if err := s.checkSize(size); err != nil {
		return Info{}, err
	}
	if size < v.SizeBytes {
		return Info{}, errdefs.Newf(errdefs.ErrInvalid, "volume %q is %d MiB: a volume only grows", v.Name, v.SizeBytes/MiB)
	}
	if size == v.SizeBytes {
		return s.info(ctx, v)
	}
	if v, err = s.st.ResizeVolume(ctx, v.ID, size, s.storeLimits()); err != nil {
		return Info{}, s.storeError(err, ref)
	}
	s.log.Info("volume resized", "volume_id", v.ID, "size_bytes", size)
	return Info{Volume: v}, nil
}

// Fork makes account's volume name, a copy of volume ref's data as it is
// now: this node's image copied (its blocks shared where the file system
// can, sparse otherwise), or in a cluster the blob store's copy shared.
// 409 while ref is attached read-write (its data is changing) or its
// newest data is on another node.
func (s *Service) Fork(ctx context.Context, account, ref, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	src, err := s.lookup(ctx, account, ref)
	if err != nil {
		return Info{}, err
	}
	fork := store.Volume{
		ID: store.NewID(idPrefix), AccountID: account, Name: name, SizeBytes: src.SizeBytes,
		GuestWritten: src.GuestWritten, BlobKey: src.BlobKey, Generation: src.Generation, ForkedFrom: src.ID,
	}
	unlock := s.lock(src.ID)
	defer unlock()
	switch src.DataNode {
	case "":
	case s.cfg.NodeID:
		if _, err := os.Stat(s.image(src.ID)); err == nil {
			if err := copyImage(s.image(src.ID), s.image(fork.ID)); err != nil {
				return Info{}, fmt.Errorf("fork volume %s: %w", src.Name, err)
			}
			if err := s.writeGeneration(fork.ID, fork.Generation); err != nil {
				s.removeLocal(fork.ID)
				return Info{}, err
			}
			fork.DataNode = s.cfg.NodeID
		}
	default:
		return Info{}, errdefs.Newf(errdefs.ErrConflict, "volume %q's newest data is on node %s: fork it once no sandbox writes it there", src.Name, src.DataNode)
	}
	if err := s.st.ForkVolume(ctx, src.ID, &fork, s.storeLimits()); err != nil {
		s.removeLocal(fork.ID)
		return Info{}, s.storeError(err, name)
	}
	s.log.Info("volume forked", "volume_id", fork.ID, "from", src.ID, "name", name)
	return Info{Volume: fork}, nil
}

// Mount is one volume a create asks for.
type Mount struct {
	Name     string // the volume's name or id
	Path     string // where, in the sandbox
	ReadOnly bool
}

// Resolve checks a create's mounts for account on this node's runtime and
// answers them as the sandbox's attachments (recorded with its row, which
// takes the leases): each volume must exist, each path be allowed
// (runtime.CheckVolumePath, and not the workspace, which is the account's
// repository), no volume twice, and a gVisor sandbox gets no volume a
// microVM wrote.
func (s *Service) Resolve(ctx context.Context, account string, mounts []Mount) ([]store.VolumeAttachment, error) {
	var out []store.VolumeAttachment
	for _, m := range mounts {
		if err := runtime.CheckVolumePath(m.Path); err != nil {
			return nil, errdefs.New(errdefs.ErrInvalid, err.Error())
		}
		if m.Path == workspace || strings.HasPrefix(m.Path, workspace+"/") {
			return nil, errdefs.Newf(errdefs.ErrInvalid, "volume path %q: %s is the account's repository; mount volumes elsewhere", m.Path, workspace)
		}
		v, err := s.lookup(ctx, account, m.Name)
		if err != nil {
			return nil, err
		}
		for _, a := range out {
			if a.VolumeID == v.ID {
				return nil, errdefs.Newf(errdefs.ErrInvalid, "volume %q is mounted twice: once is enough", m.Name)
			}
		}
		if err := s.checkBackend(v); err != nil {
			return nil, err
		}
		if v.DataNode != "" && v.DataNode != s.cfg.NodeID {
			return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q's newest data is on node %s, not synced yet: a sandbox writes it there, or the node went down before it synced (it is released when the node is declared down)", v.Name, v.DataNode)
		}
		out = append(out, store.VolumeAttachment{VolumeID: v.ID, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	paths := make([]string, len(out))
	for i, a := range out {
		paths[i] = a.Path
	}
	if err := runtime.CheckVolumeOverlap(paths); err != nil {
		return nil, errdefs.New(errdefs.ErrInvalid, err.Error())
	}
	return out, nil
}

// workspace is the account's repository in every sandbox.
const workspace = "/workspace"

// checkBackend refuses v to this node's gVisor runtime when a microVM
// wrote it.
func (s *Service) checkBackend(v store.Volume) error {
	if v.GuestWritten && s.cfg.Runtime == "gvisor" {
		return errdefs.Newf(errdefs.ErrConflict, "volume %q was written by a microVM's kernel, and a gVisor sandbox's volume is mounted by the host's kernel, which never mounts a disk a guest wrote: attach it to microVM sandboxes, or fork its data into a new volume from one", v.Name)
	}
	return nil
}

// image is this node's image of volume id; generation file the
// generation it holds.
func (s *Service) image(id string) string { return filepath.Join(s.cfg.Dir, id+".img") }

func (s *Service) generationFile(id string) string { return filepath.Join(s.cfg.Dir, id+".gen") }

// lock serialises what this node does to its image of volume id.
func (s *Service) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// removeLocal removes this node's image of volume id.
func (s *Service) removeLocal(id string) {
	for _, p := range []string{s.image(id), s.generationFile(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove a volume's image", "path", p, "err", err)
		}
	}
}

// collectBlob deletes the blob store's copy key when no volume names it.
func (s *Service) collectBlob(ctx context.Context, key string) {
	if key == "" || s.cfg.Blobs == nil {
		return
	}
	if n, err := s.st.CountVolumesWithBlob(ctx, key); err != nil || n > 0 {
		return
	}
	if err := s.cfg.Blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
		s.log.Warn("delete a volume's copy", "blob", key, "err", err)
	}
}
