package store_test

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestVolumeLeases: a volume is attached read-write to one sandbox, or
// read-only to any number, never both, and the lease is taken with the
// sandbox's row or the row is refused; a volume attached is neither
// resized, deleted nor forked (read-write), and a node's death releases
// its sandboxes' leases and its volumes' data.
func TestVolumeLeases(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "Vol")
		lim := store.VolumeLimits{Count: 2, Bytes: 3 << 30}
		data := store.Volume{ID: store.NewID("vol_"), AccountID: a.ID, Name: "data", SizeBytes: 1 << 30}
		if err := s.CreateVolumeWithin(ctx, &data, lim); err != nil {
			t.Fatal(err)
		}
		dup := store.Volume{ID: store.NewID("vol_"), AccountID: a.ID, Name: "data", SizeBytes: 1 << 30}
		if err := s.CreateVolumeWithin(ctx, &dup, lim); !errors.Is(err, store.ErrConflict) {
			t.Errorf("a second volume called data: %v, want ErrConflict", err)
		}
		big := store.Volume{ID: store.NewID("vol_"), AccountID: a.ID, Name: "big", SizeBytes: 3 << 30}
		if err := s.CreateVolumeWithin(ctx, &big, lim); !errors.Is(err, store.ErrQuota) {
			t.Errorf("a volume past the account's bytes: %v, want ErrQuota", err)
		}

		sandbox := func(node string, vols ...store.VolumeAttachment) (store.Sandbox, error) {
			sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: a.ID, NodeID: node, Status: store.SandboxRunning, Runtime: "gvisor", Volumes: vols}
			return sb, s.CreateSandbox(ctx, &sb)
		}
		rw := store.VolumeAttachment{VolumeID: data.ID, Path: "/data"}
		ro := store.VolumeAttachment{VolumeID: data.ID, Path: "/data", ReadOnly: true}
		w, err := sandbox("n1", rw)
		if err != nil {
			t.Fatal(err)
		}
		var busy *store.VolumeBusyError
		if _, err := sandbox("n1", rw); !errors.As(err, &busy) || busy.SandboxID != w.ID {
			t.Errorf("a second writer: %v, want busy with %s", err, w.ID)
		}
		if _, err := sandbox("n1", ro); !errors.As(err, &busy) {
			t.Errorf("a reader beside a writer: %v, want busy", err)
		}
		if _, err := s.GetSandbox(ctx, busy.SandboxID); err != nil {
			t.Errorf("the holder: %v", err)
		}
		if _, err := s.ResizeVolume(ctx, data.ID, 2<<30, lim); !errors.As(err, &busy) {
			t.Errorf("resize while attached: %v", err)
		}
		if _, err := s.DeleteVolume(ctx, data.ID); !errors.As(err, &busy) {
			t.Errorf("delete while attached: %v", err)
		}
		fork := store.Volume{ID: store.NewID("vol_"), AccountID: a.ID, Name: "copy", SizeBytes: 1 << 30}
		if err := s.ForkVolume(ctx, data.ID, &fork, lim); !errors.As(err, &busy) {
			t.Errorf("fork while attached read-write: %v", err)
		}
		if atts, err := s.SandboxVolumes(ctx, w.ID); err != nil || len(atts) != 1 || atts[0].Path != "/data" || atts[0].ReadOnly {
			t.Errorf("the writer's volumes: %+v, %v", atts, err)
		}
		if ids, err := s.VolumeSandboxesOnNode(ctx, "n1"); err != nil || len(ids) != 1 || ids[0] != w.ID {
			t.Errorf("sandboxes with volumes on n1: %v, %v", ids, err)
		}
		if err := s.DetachVolume(ctx, w.ID, data.ID); err != nil {
			t.Fatal(err)
		}

		r1, err := sandbox("n1", ro)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sandbox("n2", ro); err != nil {
			t.Errorf("a second reader: %v", err)
		}
		if _, err := sandbox("n1", rw); !errors.As(err, &busy) || !busy.ReadOnly {
			t.Errorf("a writer beside readers: %v", err)
		}
		if err := s.ForkVolume(ctx, data.ID, &fork, lim); err != nil {
			t.Errorf("fork while attached read-only: %v", err)
		}
		// n2 goes down: its reader's lease goes, n1's stays.
		if _, err := s.VolumeData(ctx, data.ID, "n2", "", 3); err != nil {
			t.Fatal(err)
		}
		lost, err := s.ReleaseVolumesOfNode(ctx, "n2")
		if err != nil || len(lost) != 1 || lost[0].ID != data.ID {
			t.Fatalf("release n2: %+v, %v", lost, err)
		}
		held, _ := s.VolumeAttachments(ctx, data.ID)
		if len(held) != 1 || held[0].SandboxID != r1.ID {
			t.Errorf("after n2 went down: %+v, want only %s", held, r1.ID)
		}
		if v, _ := s.GetVolume(ctx, data.ID); v.DataNode != "" || v.Generation != 3 {
			t.Errorf("after n2 went down: %+v, want no data node", v)
		}
		_ = s.DetachVolume(ctx, r1.ID, data.ID)
		if v, err := s.ResizeVolume(ctx, data.ID, 2<<30, lim); err != nil || v.SizeBytes != 2<<30 {
			t.Errorf("resize: %+v, %v", v, err)
		}
		if _, err := s.ResizeVolume(ctx, data.ID, 3<<30, lim); !errors.Is(err, store.ErrQuota) {
			t.Errorf("resize past the quota: %v", err)
		}
		if _, err := s.DeleteVolume(ctx, data.ID); err != nil {
			t.Errorf("delete: %v", err)
		}
		if _, err := s.GetVolume(ctx, data.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("after delete: %v", err)
		}
	})
}
