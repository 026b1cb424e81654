package volumes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The Service is the sandbox lifecycle's volume hook (sandbox.Hook): its
// Prestart readies the sandbox's volumes on this node and adds them to its
// spec, its Stop syncs what the sandbox wrote and releases the leases, its
// Reconcile does that for sandboxes that ended while the node was down.

// Name implements sandbox.Hook.
func (s *Service) Name() string { return "volumes" }

// FailureReason implements sandbox.PrestartHook.
func (s *Service) FailureReason() string { return "could not attach its volumes" }

// Prestart implements sandbox.PrestartHook: each of the sandbox's volumes
// gets its newest data on this node (its image here, a download, or a new
// disk for a volume never written) and is added to spec.
func (s *Service) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	atts, err := s.st.SandboxVolumes(ctx, sb.ID)
	if err != nil {
		return err
	}
	for _, a := range atts {
		v, err := s.st.GetVolume(ctx, a.VolumeID)
		if err != nil {
			return fmt.Errorf("volume %s: %w", a.VolumeID, err)
		}
		if err := s.checkBackend(v); err != nil {
			return err
		}
		img, err := s.ready(ctx, v, !a.ReadOnly)
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
		spec.Volumes = append(spec.Volumes, runtime.VolumeMount{Image: img, Path: a.Path, ReadOnly: a.ReadOnly})
	}
	return nil
}

// ready makes this node's image of v hold its newest data and answers its
// path. For a writer it records this node as the newest data's (and, on
// a microVM, the volume as guest-written) before the sandbox starts.
func (s *Service) ready(ctx context.Context, v store.Volume, write bool) (string, error) {
	unlock := s.lock(v.ID)
	defer unlock()
	img := s.image(v.ID)
	gen, have := s.localGeneration(v.ID)
	switch {
	case v.DataNode == s.cfg.NodeID:
		if !have {
			return "", fmt.Errorf("its newest data should be on this node, and its image (%s) is missing", img)
		}
	case v.DataNode != "":
		return "", errdefs.Newf(errdefs.ErrConflict, "its newest data is on node %s, not synced yet (a sandbox writes it there, or the node went down before it synced)", v.DataNode)
	case have && gen == v.Generation:
	case v.BlobKey == "":
		// Never written: a new, empty disk.
		s.removeLocal(v.ID)
		if err := ext4.Create(ctx, img, v.SizeBytes, ext4.Options{Label: "sandboxd-vol", BlockSize: 4096, RootOwner: true, RootMode: 0o1777, Lazy: true}); err != nil {
			return "", err
		}
		if err := s.writeGeneration(v.ID, v.Generation); err != nil {
			return "", err
		}
	default:
		if err := s.download(ctx, v); err != nil {
			return "", err
		}
	}
	if write {
		// The image may be smaller than the volume (resized since): the
		// disk grows here, its file system as it is mounted.
		if fi, err := os.Stat(img); err == nil && fi.Size() < v.SizeBytes {
			if err := os.Truncate(img, v.SizeBytes); err != nil {
				return "", fmt.Errorf("grow its image: %w", err)
			}
		}
		if s.cfg.Runtime == "microvm" && !v.GuestWritten {
			if err := s.st.MarkVolumeGuestWritten(ctx, v.ID); err != nil {
				return "", err
			}
		}
		if v.DataNode != s.cfg.NodeID {
			if _, err := s.st.VolumeData(ctx, v.ID, s.cfg.NodeID, "", v.Generation); err != nil {
				return "", err
			}
		}
	}
	return img, nil
}

// Stop implements sandbox.StopHook: what sandbox id wrote to a volume on
// this node is synced (a new generation; in a cluster, uploaded), then its
// leases go, unless it is paused with its files (it keeps them for its
// resume, on any node). Idempotent.
func (s *Service) Stop(ctx context.Context, id string) error {
	atts, err := s.st.SandboxVolumes(ctx, id)
	if err != nil || len(atts) == 0 {
		return err
	}
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	keep := err == nil && sb.PausedFiles && sb.Status == store.SandboxRunning
	var errs []error
	for _, a := range atts {
		if !a.ReadOnly {
			if err := s.sync(ctx, a.VolumeID); err != nil {
				// The data stays on this node (its row says so), whose
				// next start tries again (Reconcile); the lease goes all
				// the same, and the sandbox's end is not held up: an
				// attach elsewhere is refused until the sync.
				s.log.Warn("sync a volume a sandbox wrote; its data stays on this node", "volume_id", a.VolumeID, "sandbox_id", id, "err", err)
			}
		}
		if keep {
			continue
		}
		if err := s.st.DetachVolume(ctx, id, a.VolumeID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sync records what a writer on this node left in volume id's image as
// its next generation: in a cluster the image is uploaded and the blob
// store's copy becomes the newest; on one node the image is.
func (s *Service) sync(ctx context.Context, id string) error {
	unlock := s.lock(id)
	defer unlock()
	v, err := s.st.GetVolume(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		s.removeLocal(id)
		return nil
	}
	if err != nil {
		return err
	}
	if v.DataNode != s.cfg.NodeID {
		return nil // nothing of this node's is newer
	}
	if _, have := s.localGeneration(id); !have {
		return nil
	}
	gen := v.Generation + 1
	if !s.cfg.Sync {
		if err := s.writeGeneration(id, gen); err != nil {
			return err
		}
		_, err := s.st.VolumeData(ctx, id, s.cfg.NodeID, "", gen)
		return err
	}
	key, err := s.upload(ctx, v)
	if err != nil {
		return fmt.Errorf("sync volume %q: %w", v.Name, err)
	}
	if err := s.writeGeneration(id, gen); err != nil {
		return err
	}
	prev, err := s.st.VolumeData(ctx, id, "", key, gen)
	if err != nil {
		return err
	}
	if prev != key {
		s.collectBlob(ctx, prev)
	}
	return nil
}

// Reconcile implements sandbox.ReconcileHook: the leases of sandboxes
// that ended while this node was down (or whose row is gone) are synced
// and released, a volume whose newest data is here but that no sandbox
// writes is synced (an upload cut short), and images of deleted volumes go.
func (s *Service) Reconcile(ctx context.Context, keep func(id string) bool) error {
	ids, err := s.st.VolumeSandboxesOnNode(ctx, s.cfg.NodeID)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if !keep(id) {
			errs = append(errs, s.Stop(ctx, id))
		}
	}
	if s.cfg.Sync {
		errs = append(errs, s.syncLeft(ctx))
	}
	s.removeDeleted(ctx)
	return errors.Join(errs...)
}

// retryEvery is how often a node tries again the syncs that failed.
const retryEvery = time.Minute

// Run tries again, every minute until ctx ends, to sync the volumes whose
// newest data is on this node and that no sandbox holds: a sync that
// failed at a writer's end (the blob store was unreachable) leaves the
// volume refused to the other nodes until it succeeds. On one node there
// is nothing to do.
func (s *Service) Run(ctx context.Context) {
	if !s.cfg.Sync {
		return
	}
	t := time.NewTicker(retryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.syncLeft(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("sync the volumes left on this node", "err", err)
		}
	}
}

// syncLeft syncs the volumes whose newest data is on this node and that
// no sandbox holds.
func (s *Service) syncLeft(ctx context.Context) error {
	vs, err := s.st.ListVolumesOnNode(ctx, s.cfg.NodeID)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vs {
		held, err := s.st.VolumeAttachments(ctx, v.ID)
		if err != nil || len(held) > 0 {
			continue
		}
		errs = append(errs, s.sync(ctx, v.ID))
	}
	return errors.Join(errs...)
}

// removeDeleted removes this node's images of volumes that were deleted.
func (s *Service) removeDeleted(ctx context.Context) {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || !strings.HasPrefix(id, idPrefix) {
			continue
		}
		if _, err := s.st.GetVolume(ctx, id); errors.Is(err, store.ErrNotFound) {
			unlock := s.lock(id)
			s.removeLocal(id)
			unlock()
		}
	}
}

// localGeneration is the generation of this node's image of volume id;
// have is false when there is none.
func (s *Service) localGeneration(id string) (gen int64, have bool) {
	if _, err := os.Stat(s.image(id)); err != nil {
		return 0, false
	}
	b, err := os.ReadFile(s.generationFile(id))
	if err != nil {
		return 0, false
	}
	gen, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return gen, err == nil
}

// writeGeneration records that this node's image of volume id holds gen.
func (s *Service) writeGeneration(id string, gen int64) error {
	tmp := s.generationFile(id) + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(gen, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.generationFile(id))
}
