package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestCursor(t *testing.T) {
	c := store.Cursor{CreatedAt: t0ms, ID: "sbx_1:2"} // an id may hold the separator
	got, err := store.ParseCursor(c.String())
	if err != nil || got != c {
		t.Fatalf("ParseCursor(%q) = %+v, %v; want %+v", c.String(), got, err, c)
	}
	if got, err := store.ParseCursor(""); err != nil || !got.IsZero() {
		t.Fatalf(`ParseCursor("") = %+v, %v; want the start`, got, err)
	}
	if s := (store.Cursor{}).String(); s != "" {
		t.Fatalf("the start encodes as %q, want empty", s)
	}
	for _, bad := range []string{"o:10", "b286MTA", "!!", "YzE6", "YzE6eDp5", "YzE6MTI6"} {
		if _, err := store.ParseCursor(bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ParseCursor(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// pages reads a whole list page by page and checks that each page is
// at most size long.
func pages[T any](t *testing.T, size int, page func(store.Cursor, int) ([]T, error), cursor func(T) store.Cursor) []T {
	t.Helper()
	var all []T
	after := store.Cursor{}
	for range 1000 {
		got, err := page(after, size)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > size {
			t.Fatalf("a page of %d has %d rows", size, len(got))
		}
		all = append(all, got...)
		if len(got) < size {
			return all
		}
		after = cursor(got[len(got)-1])
	}
	t.Fatal("the list never ended")
	return nil
}

// TestListSandboxesPage: pages, read one after another, are the whole list
// newest first, each row once, also across rows created in the same
// millisecond; another account's rows are on none.
func TestListSandboxesPage(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		mustSandbox(t, s, bob.ID, "n1", store.SandboxRunning, t0)
		for i := range 7 {
			// Pairs share their creation time.
			mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0.Add(time.Duration(i/2)*time.Second))
		}
		all, err := s.ListSandboxes(ctx, alice.ID)
		if err != nil || len(all) != 7 {
			t.Fatalf("ListSandboxes = %d sandboxes, %v; want 7", len(all), err)
		}
		newestFirst := ids(all, func(sb store.Sandbox) string { return sb.ID })
		for size := 1; size <= 8; size++ {
			got := pages(t, size, func(after store.Cursor, n int) ([]store.Sandbox, error) {
				return s.ListSandboxesPage(ctx, alice.ID, after, n)
			}, func(sb store.Sandbox) store.Cursor { return store.Cursor{CreatedAt: sb.CreatedAt, ID: sb.ID} })
			if g := ids(got, func(sb store.Sandbox) string { return sb.ID }); !slices.Equal(g, newestFirst) {
				t.Fatalf("pages of %d = %v, want %v", size, g, newestFirst)
			}
		}
	})
}

func TestListActiveSandboxes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		pending := mustSandbox(t, s, alice.ID, "n1", store.SandboxPending, t0)
		running := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0.Add(time.Second))
		stopping := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopping, t0.Add(2*time.Second))
		mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0.Add(3*time.Second))
		mustSandbox(t, s, alice.ID, "n1", store.SandboxFailed, t0.Add(4*time.Second))
		mustSandbox(t, s, bob.ID, "n1", store.SandboxRunning, t0)
		got, err := s.ListActiveSandboxes(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if g, want := ids(got, func(sb store.Sandbox) string { return sb.ID }), []string{stopping.ID, running.ID, pending.ID}; !slices.Equal(g, want) {
			t.Fatalf("ListActiveSandboxes = %v, want %v", g, want)
		}
	})
}

func TestListRunsPage(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		for i := range 5 {
			for _, a := range []store.Account{alice, bob} {
				r := store.Run{AccountID: a.ID, Task: "t", CreatedAt: t0.Add(time.Duration(i/2) * time.Second)}
				if err := s.CreateRun(ctx, &r); err != nil {
					t.Fatal(err)
				}
			}
		}
		runID := func(r store.Run) string { return r.ID }
		all, err := s.ListRuns(ctx, alice.ID, 0)
		if err != nil || len(all) != 5 {
			t.Fatalf("ListRuns = %d runs, %v; want 5", len(all), err)
		}
		for size := 1; size <= 6; size++ {
			got := pages(t, size, func(after store.Cursor, n int) ([]store.Run, error) {
				return s.ListRunsPage(ctx, alice.ID, after, n)
			}, func(r store.Run) store.Cursor { return store.Cursor{CreatedAt: r.CreatedAt, ID: r.ID} })
			if !slices.Equal(ids(got, runID), ids(all, runID)) {
				t.Fatalf("pages of %d = %v, want %v", size, ids(got, runID), ids(all, runID))
			}
		}
	})
}

// TestListLiveE2BSandboxesPastEnded: an account's live E2B sandboxes are
// listed whole, page after page, however many of its sandboxes ended
// after they started; stopping ones are not live.
func TestListLiveE2BSandboxesPastEnded(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		var live []string
		statuses := []store.SandboxStatus{store.SandboxRunning, store.SandboxPending}
		for i := range 4 {
			live = append(live, mustE2B(t, s, alice.ID, statuses[i%2], t0.Add(time.Duration(i)*time.Second)).ID)
		}
		slices.Reverse(live) // newest first
		at := t0.Add(time.Hour)
		if err := s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
			for i := range 1100 {
				status := store.SandboxStopped
				if i%100 == 0 {
					status = store.SandboxStopping
				}
				if _, err := e2bSandbox(ctx, q, alice.ID, status, at.Add(time.Duration(i)*time.Millisecond)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		got := pages(t, 3, func(after store.Cursor, n int) ([]store.E2BSandbox, error) {
			return s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{After: after, Limit: n})
		}, store.E2BSandbox.Cursor)
		if !slices.Equal(e2bIDs(got), live) {
			t.Fatalf("live E2B sandboxes, by pages of 3 = %v, want %v", e2bIDs(got), live)
		}
	})
}

// e2bSandbox inserts a sandbox with its E2B record, both created at.
func e2bSandbox(ctx context.Context, q *store.Queries, accountID string, status store.SandboxStatus, at time.Time) (store.Sandbox, error) {
	sb := store.Sandbox{AccountID: accountID, NodeID: "n1", Status: status, Runtime: "gvisor", CreatedAt: at, Deadline: at.Add(time.Hour)}
	if status == store.SandboxStopped {
		sb.StoppedAt = &at
	}
	if err := q.CreateSandbox(ctx, &sb); err != nil {
		return sb, err
	}
	e := store.E2BSandbox{SandboxID: sb.ID, AccountID: accountID, TemplateID: "base", AccessToken: "tok", CreatedAt: at}
	if err := q.CreateE2BSandbox(ctx, e); err != nil {
		return sb, fmt.Errorf("record %s: %w", sb.ID, err)
	}
	return sb, nil
}

func mustE2B(t *testing.T, s *store.Store, accountID string, status store.SandboxStatus, at time.Time) store.Sandbox {
	t.Helper()
	sb, err := e2bSandbox(t.Context(), s.Queries, accountID, status, at)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestSetupSandboxesAreNotListed: the sandbox of an account's setup is
// left out of its lists (paged and active alike), and found by id; a
// coding agent's is listed.
func TestSetupSandboxesAreNotListed(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		own := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		setup := store.Sandbox{AccountID: alice.ID, NodeID: "n1", Status: store.SandboxRunning, Runtime: "gvisor", Task: store.SandboxTaskSetup, CreatedAt: t0.Add(time.Second), Deadline: t0.Add(time.Hour)}
		agent := store.Sandbox{AccountID: alice.ID, NodeID: "n1", Status: store.SandboxRunning, Runtime: "gvisor", Task: "coding-agent", CreatedAt: t0.Add(2 * time.Second), Deadline: t0.Add(time.Hour)}
		for _, sb := range []*store.Sandbox{&setup, &agent} {
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{agent.ID, own.ID}
		page, err := s.ListSandboxesPage(ctx, alice.ID, store.Cursor{}, 10)
		if g := ids(page, func(sb store.Sandbox) string { return sb.ID }); err != nil || !slices.Equal(g, want) {
			t.Fatalf("ListSandboxesPage = %v (%v), want %v", g, err, want)
		}
		active, err := s.ListActiveSandboxes(ctx, alice.ID)
		if g := ids(active, func(sb store.Sandbox) string { return sb.ID }); err != nil || !slices.Equal(g, want) {
			t.Fatalf("ListActiveSandboxes = %v (%v), want %v", g, err, want)
		}
		if got, err := s.GetSandbox(ctx, setup.ID); err != nil || got.Task != store.SandboxTaskSetup {
			t.Fatalf("GetSandbox of the setup's: %+v, %v", got, err)
		}
	})
}
