package host

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

type testMeta struct {
	ID  string `json:"id"`
	CID string `json:"cid"`
}

func (m testMeta) SandboxID() string { return m.ID }

// TestReattach lays out a state directory as an earlier process leaves it
// and checks what is served again and what is destroyed.
func TestReattach(t *testing.T) {
	d := Dir(t.TempDir())
	for _, sub := range []string{"ids", "sandboxes"} {
		if err := os.MkdirAll(string(d)+"/"+sub, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sandbox := func(cid string, m *testMeta, claimBy string) {
		if err := os.MkdirAll(d.SandboxDir(cid), 0o700); err != nil {
			t.Fatal(err)
		}
		if m != nil {
			if err := WriteMeta(d.SandboxDir(cid), *m); err != nil {
				t.Fatal(err)
			}
		}
		if claimBy != "" {
			if err := d.Claim(claimBy, cid); err != nil {
				t.Fatal(err)
			}
		}
	}
	sandbox("c-live", &testMeta{ID: "live", CID: "c-live"}, "live")
	sandbox("c-unclaimed", &testMeta{ID: "gone", CID: "c-unclaimed"}, "")
	sandbox("c-warm", &testMeta{CID: "c-warm"}, "")
	sandbox("c-broken", nil, "broken")
	sandbox("c-other", &testMeta{ID: "a", CID: "c-other"}, "b") // claimed by another id

	if err := d.Claim("live", "c-x"); !errors.Is(err, runtime.ErrExists) {
		t.Fatalf("claiming a taken id: %v", err)
	}
	var served, destroyed []string
	err := Reattach(context.Background(), d, slog.New(slog.DiscardHandler), Backend[testMeta]{
		Blank: func(cid string) testMeta { return testMeta{CID: cid} },
		Destroy: func(_ context.Context, dir string, m testMeta) error {
			destroyed = append(destroyed, m.CID)
			return d.Remove(dir, m.ID, m.CID)
		},
		Serve: func(_ context.Context, _ string, m testMeta) { served = append(served, m.CID) },
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(destroyed)
	if !slices.Equal(served, []string{"c-live"}) || !slices.Equal(destroyed, []string{"c-broken", "c-other", "c-unclaimed", "c-warm"}) {
		t.Fatalf("served %v, destroyed %v", served, destroyed)
	}
	if _, err := os.Stat(d.SandboxDir("c-warm")); !os.IsNotExist(err) {
		t.Fatalf("a destroyed sandbox's directory is left: %v", err)
	}

	tab := NewTable[*testMeta](string(d))
	live := &testMeta{ID: "live", CID: "c-live"}
	tab.Put("c-live", live)
	if got, err := tab.Get("live"); err != nil || got != live {
		t.Fatalf("Get(live) = %v, %v", got, err)
	}
	for _, id := range []string{"../etc", "unknown"} {
		if _, err := tab.Get(id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Get(%q): %v", id, err)
		}
	}
	tab.Remove("c-live", &testMeta{}) // not the one recorded: kept
	if len(tab.All()) != 1 {
		t.Fatal("Remove of another value dropped the sandbox")
	}
	tab.Remove("c-live", live)
	if _, err := tab.Get("live"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
}
