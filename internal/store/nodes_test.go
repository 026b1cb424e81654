package store_test

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestNodes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		steps := []struct {
			name string
			do   func() error
			want error
			// The node list afterwards.
			wantNodes []store.Node
		}{
			{"add b", func() error { return s.UpsertNode(ctx, &store.Node{ID: "b", Hostname: "host-b", StartedAt: t0}) }, nil,
				[]store.Node{{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms}}},
			{"add a", func() error {
				return s.UpsertNode(ctx, &store.Node{ID: "a", Hostname: "host-a", StartedAt: t0, HeartbeatAt: t0.Add(time.Second)})
			}, nil, []store.Node{
				{ID: "a", Hostname: "host-a", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Second)},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms}}},
			{"heartbeat b", func() error { return s.HeartbeatNode(ctx, "b", t0.Add(time.Minute)) }, nil, []store.Node{
				{ID: "a", Hostname: "host-a", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Second)},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Minute)}}},
			{"restart a", func() error {
				return s.UpsertNode(ctx, &store.Node{ID: "a", Hostname: "host-a2", StartedAt: t0.Add(time.Hour)})
			}, nil, []store.Node{
				{ID: "a", Hostname: "host-a2", StartedAt: t0ms.Add(time.Hour), HeartbeatAt: t0ms.Add(time.Hour)},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Minute)}}},
			{"heartbeat missing", func() error { return s.HeartbeatNode(ctx, "c", t0) }, store.ErrNotFound, nil},
			{"no id", func() error { return s.UpsertNode(ctx, &store.Node{Hostname: "x"}) }, store.ErrInvalid, nil},
			{"nil", func() error { return s.UpsertNode(ctx, nil) }, store.ErrInvalid, nil},
		}
		var want []store.Node
		for _, tt := range steps {
			wantErr(t, tt.name, tt.do(), tt.want)
			if tt.wantNodes != nil {
				want = tt.wantNodes
			}
			got, err := s.ListNodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%s: ListNodes = %+v, want %+v", tt.name, got, want)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s: ListNodes = %+v, want %+v", tt.name, got, want)
				}
			}
		}
	})
}
