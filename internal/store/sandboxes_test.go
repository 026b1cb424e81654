package store_test

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestCreateSandbox(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		snap := mustSnapshot(t, s, alice.ID, "", t0)

		tests := []struct {
			name string
			in   *store.Sandbox
			want error
		}{
			{"defaults", &store.Sandbox{AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor", Deadline: t0}, nil},
			{"full", &store.Sandbox{ID: "sb-full", AccountID: alice.ID, NodeID: "n1", Status: store.SandboxFailed, Runtime: "microvm",
				FailureReason: "boom", SnapshotID: snap.ID, CreatedAt: t0, UpdatedAt: t0.Add(time.Second), Deadline: t0.Add(time.Hour),
				StoppedAt: ptr(t0.Add(time.Minute))}, nil},
			{"duplicate id", &store.Sandbox{ID: "sb-full", AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor"}, store.ErrConflict},
			{"unknown account", &store.Sandbox{AccountID: "missing", NodeID: "n1", Runtime: "gvisor"}, store.ErrNotFound},
			{"unknown snapshot", &store.Sandbox{AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor", SnapshotID: "missing"}, store.ErrNotFound},
			{"unknown status", &store.Sandbox{AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor", Status: "sleeping"}, store.ErrInvalid},
			{"nil", nil, store.ErrInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := s.CreateSandbox(ctx, tt.in)
				wantErr(t, "CreateSandbox", err, tt.want)
				if err != nil {
					return
				}
				got, err := s.GetSandbox(ctx, tt.in.ID)
				if err != nil {
					t.Fatal(err)
				}
				if !sandboxEqual(got, *tt.in) {
					t.Fatalf("GetSandbox = %+v, want %+v", got, *tt.in)
				}
			})
		}
		def, _ := s.ListSandboxesByNode(ctx, "n1", store.SandboxPending)
		if len(def) != 1 || def[0].Status != store.SandboxPending || def[0].UpdatedAt != def[0].CreatedAt || def[0].CreatedAt.IsZero() {
			t.Errorf("defaults not filled: %+v", def)
		}
		_, err := s.GetSandbox(ctx, "missing")
		wantErr(t, "GetSandbox(missing)", err, store.ErrNotFound)

		// Deleting the snapshot a sandbox started from keeps the sandbox.
		if _, err := s.DeleteSnapshotsOf(ctx, alice.ID); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, "sb-full")
		if err != nil || got.SnapshotID != "" {
			t.Errorf("after deleting its snapshot: %+v, %v; want SnapshotID cleared", got, err)
		}
	})
}

func sandboxEqual(a, b store.Sandbox) bool {
	sa, sb := a.StoppedAt, b.StoppedAt
	a.StoppedAt, b.StoppedAt = nil, nil
	a.Volumes, b.Volumes = nil, nil // the create's input, not read back
	return reflect.DeepEqual(a, b) && ((sa == nil) == (sb == nil)) && (sa == nil || *sa == *sb)
}

func TestListSandboxes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		a1 := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		a2 := mustSandbox(t, s, alice.ID, "n2", store.SandboxPending, t0.Add(time.Second))
		a3 := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0.Add(2*time.Second))
		a4 := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopping, t0.Add(3*time.Second))
		b1 := mustSandbox(t, s, bob.ID, "n1", store.SandboxPending, t0.Add(4*time.Second))
		b2 := mustSandbox(t, s, bob.ID, "n2", store.SandboxFailed, t0.Add(5*time.Second))
		id := func(sb store.Sandbox) string { return sb.ID }

		byAccount := []struct {
			account string
			want    []string
		}{
			{alice.ID, []string{a4.ID, a3.ID, a2.ID, a1.ID}},
			{bob.ID, []string{b2.ID, b1.ID}},
			{"missing", []string{}},
		}
		for _, tt := range byAccount {
			got, err := s.ListSandboxes(ctx, tt.account)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, id); !slices.Equal(g, tt.want) {
				t.Errorf("ListSandboxes(%s) = %v, want %v", tt.account, g, tt.want)
			}
		}

		byNode := []struct {
			node     string
			statuses []store.SandboxStatus
			want     []string
		}{
			{"n1", nil, []string{a1.ID, a3.ID, a4.ID, b1.ID}},
			{"n1", []store.SandboxStatus{store.SandboxRunning, store.SandboxPending}, []string{a1.ID, b1.ID}},
			{"n2", []store.SandboxStatus{store.SandboxFailed}, []string{b2.ID}},
			{"n3", nil, []string{}},
		}
		for _, tt := range byNode {
			got, err := s.ListSandboxesByNode(ctx, tt.node, tt.statuses...)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, id); !slices.Equal(g, tt.want) {
				t.Errorf("ListSandboxesByNode(%s, %v) = %v, want %v", tt.node, tt.statuses, g, tt.want)
			}
		}

		counts := []struct {
			account string
			want    int
		}{
			{alice.ID, 3}, {bob.ID, 1}, {"", 4}, {"missing", 0},
		}
		for _, tt := range counts {
			got, err := s.CountActiveSandboxes(ctx, tt.account)
			if err != nil || got != tt.want {
				t.Errorf("CountActiveSandboxes(%q) = %d, %v; want %d", tt.account, got, err, tt.want)
			}
		}

		// Deadlines are t0+1h+i s; a1 (running) and a2 (pending) expire first.
		wantErr(t, "SetSandboxDeadline", s.SetSandboxDeadline(ctx, b1.ID, t0.Add(-time.Hour)), nil)
		wantErr(t, "SetSandboxDeadline(missing)", s.SetSandboxDeadline(ctx, "missing", t0), store.ErrNotFound)
		got, _ := s.GetSandbox(ctx, b1.ID)
		if got.Deadline != t0ms.Add(-time.Hour) {
			t.Errorf("Deadline = %v, want %v", got.Deadline, t0ms.Add(-time.Hour))
		}
		expired := []struct {
			node string
			now  time.Time
			want []string
		}{
			{"n1", t0, []string{b1.ID}},
			{"n1", t0.Add(time.Hour), []string{b1.ID, a1.ID}},
			{"n1", t0.Add(2 * time.Hour), []string{b1.ID, a1.ID}}, // a3 stopped, a4 stopping
			{"n2", t0.Add(2 * time.Hour), []string{a2.ID}},        // b2 failed
			{"", t0.Add(2 * time.Hour), []string{b1.ID, a1.ID, a2.ID}},
		}
		for _, tt := range expired {
			got, err := s.ListExpiredSandboxes(ctx, tt.node, tt.now)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, id); !slices.Equal(g, tt.want) {
				t.Errorf("ListExpiredSandboxes(%q, %v) = %v, want %v", tt.node, tt.now, g, tt.want)
			}
		}

		wantErr(t, "DeleteSandboxesOf", s.DeleteSandboxesOf(ctx, alice.ID), nil)
		if got, _ := s.ListSandboxes(ctx, alice.ID); len(got) != 0 {
			t.Errorf("alice still has %d sandboxes", len(got))
		}
		if got, _ := s.ListSandboxes(ctx, bob.ID); len(got) != 2 {
			t.Errorf("bob has %d sandboxes, want 2", len(got))
		}
		wantErr(t, "DeleteSandboxesOf(none)", s.DeleteSandboxesOf(ctx, "missing"), nil)
	})
}

func TestTransitionSandbox(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		sb := mustSandbox(t, s, alice.ID, "n1", store.SandboxPending, t0)

		steps := []struct {
			name        string
			id          string
			from        []store.SandboxStatus
			to          store.SandboxStatus
			reason      string
			at          time.Time
			want        bool
			wantErr     error
			wantStatus  store.SandboxStatus
			wantReason  string
			wantStopped *time.Time
		}{
			{"pending to running", sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", t0.Add(1 * time.Second), true, nil, store.SandboxRunning, "", nil},
			{"stale: pending to running", sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", t0.Add(2 * time.Second), false, nil, store.SandboxRunning, "", nil},
			{"no from states", sb.ID, nil, store.SandboxStopping, "", t0.Add(2 * time.Second), false, nil, store.SandboxRunning, "", nil},
			{"unknown status", sb.ID, []store.SandboxStatus{store.SandboxRunning}, "sleeping", "", t0.Add(2 * time.Second), false, store.ErrInvalid, store.SandboxRunning, "", nil},
			{"running to stopping", sb.ID, []store.SandboxStatus{store.SandboxPending, store.SandboxRunning}, store.SandboxStopping, "", t0.Add(3 * time.Second), true, nil, store.SandboxStopping, "", nil},
			{"stopping to failed", sb.ID, []store.SandboxStatus{store.SandboxStopping}, store.SandboxFailed, "vm crashed", t0.Add(4 * time.Second), true, nil, store.SandboxFailed, "vm crashed", ptr(t0ms.Add(4 * time.Second))},
			{"failed again keeps first stop", sb.ID, []store.SandboxStatus{store.SandboxFailed}, store.SandboxFailed, "", t0.Add(5 * time.Second), true, nil, store.SandboxFailed, "vm crashed", ptr(t0ms.Add(4 * time.Second))},
			{"missing sandbox", "missing", []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", t0, false, store.ErrNotFound, store.SandboxFailed, "vm crashed", ptr(t0ms.Add(4 * time.Second))},
		}
		lastUpdate := t0ms
		for _, tt := range steps {
			got, err := s.TransitionSandbox(ctx, tt.id, tt.from, tt.to, tt.reason, tt.at)
			wantErr(t, tt.name, err, tt.wantErr)
			if got != tt.want {
				t.Fatalf("%s: TransitionSandbox = %v, want %v", tt.name, got, tt.want)
			}
			row, err := s.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got {
				lastUpdate = ms(tt.at)
			}
			if row.Status != tt.wantStatus || row.FailureReason != tt.wantReason || row.UpdatedAt != lastUpdate ||
				(row.StoppedAt == nil) != (tt.wantStopped == nil) || (row.StoppedAt != nil && *row.StoppedAt != *tt.wantStopped) {
				t.Fatalf("%s: row %+v (stopped %v); want status %s reason %q updated %v stopped %v",
					tt.name, row, row.StoppedAt, tt.wantStatus, tt.wantReason, lastUpdate, tt.wantStopped)
			}
		}

		// Compare-and-set under contention: exactly one winner.
		sb2 := mustSandbox(t, s, alice.ID, "n1", store.SandboxPending, t0)
		var wg sync.WaitGroup
		wins := make(chan bool, 10)
		for range 10 {
			wg.Go(func() {
				ok, err := s.TransitionSandbox(ctx, sb2.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", t0)
				if err != nil {
					t.Error(err)
				}
				wins <- ok
			})
		}
		wg.Wait()
		close(wins)
		n := 0
		for ok := range wins {
			if ok {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d concurrent transitions won, want 1", n)
		}
	})
}

func ms(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// TestPause: a pause stops the deadline clock (the reaper's list skips a
// paused sandbox) and a resume starts it again from what was left; the
// pause states change only from the expected ones.
func TestPause(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "pauser")
		sb := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		if err := s.SetSandboxDeadline(ctx, sb.ID, t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		stopped := mustSandbox(t, s, a.ID, "n1", store.SandboxStopped, t0)
		if ok, err := s.BeginPause(ctx, stopped.ID, t0); ok || err != nil {
			t.Fatalf("BeginPause of a stopped sandbox: %v %v", ok, err)
		}
		if ok, err := s.BeginPause(ctx, sb.ID, t0.Add(20*time.Second)); !ok || err != nil {
			t.Fatalf("BeginPause: %v %v", ok, err)
		}
		if ok, _ := s.BeginPause(ctx, sb.ID, t0); ok {
			t.Fatal("BeginPause twice")
		}
		if ok, _ := s.TransitionPause(ctx, sb.ID, []string{store.PausePaused}, store.PauseResuming, t0); ok {
			t.Fatal("resuming a sandbox still pausing")
		}
		if ok, err := s.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, store.PausePaused, t0); !ok || err != nil {
			t.Fatalf("pausing -> paused: %v %v", ok, err)
		}
		got, err := s.GetSandbox(ctx, sb.ID)
		if err != nil || got.Pause != store.PausePaused || got.PausedRemaining != 40*time.Second {
			t.Fatalf("paused row: %+v %v", got, err)
		}
		// Long past the old deadline, it is not expired.
		if exp, err := s.ListExpiredSandboxes(ctx, "n1", t0.Add(time.Hour)); err != nil || len(exp) != 0 {
			t.Fatalf("expired while paused: %v %v", exp, err)
		}
		if ok, err := s.SetPausedRemaining(ctx, sb.ID, 90*time.Second); !ok || err != nil {
			t.Fatalf("SetPausedRemaining: %v %v", ok, err)
		}
		if ok, _ := s.TransitionPause(ctx, sb.ID, []string{store.PausePaused}, store.PauseResuming, t0.Add(time.Hour)); !ok {
			t.Fatal("paused -> resuming")
		}
		resumed := t0.Add(time.Hour + time.Second)
		if ok, err := s.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, "", resumed); !ok || err != nil {
			t.Fatalf("resuming -> running: %v %v", ok, err)
		}
		got, _ = s.GetSandbox(ctx, sb.ID)
		if got.Pause != "" || got.PausedRemaining != 0 || got.Deadline.UnixMilli() != resumed.Add(90*time.Second).UnixMilli() {
			t.Fatalf("resumed row: pause %q, remaining %v, deadline %v (want %v)", got.Pause, got.PausedRemaining, got.Deadline, resumed.Add(90*time.Second))
		}
		if ok, _ := s.SetPausedRemaining(ctx, sb.ID, time.Second); ok {
			t.Fatal("SetPausedRemaining of a sandbox not paused")
		}
		if exp, err := s.ListExpiredSandboxes(ctx, "n1", resumed.Add(2*time.Minute)); err != nil || len(exp) != 1 {
			t.Fatalf("expired after resume: %v %v", exp, err)
		}
	})
}

// TestFilesPause: a pause of the files alone ends with the saved files as
// the sandbox's template (and its paused event says memory false); its
// resume is claimed by any node, which then hosts it, only while it is
// paused so; back to running, it is an ordinary sandbox of that template.
func TestFilesPause(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "filer")
		sb := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		if ok, _ := s.SetPausingFiles(ctx, sb.ID, "tpl_saved", t0); ok {
			t.Fatal("SetPausingFiles of a sandbox not pausing")
		}
		if ok, err := s.BeginPause(ctx, sb.ID, t0); !ok || err != nil {
			t.Fatalf("BeginPause: %v %v", ok, err)
		}
		if ok, _ := s.ClaimFilesResume(ctx, sb.ID, "n2", t0); ok {
			t.Fatal("resume claimed while pausing")
		}
		if ok, _ := s.FinishFilesPause(ctx, sb.ID, t0); ok {
			t.Fatal("FinishFilesPause before SetPausingFiles")
		}
		if ok, err := s.SetPausingFiles(ctx, sb.ID, "tpl_saved", t0.Add(time.Second)); !ok || err != nil {
			t.Fatalf("SetPausingFiles: %v %v", ok, err)
		}
		if ok, err := s.AdoptFilesPaused(ctx, sb.ID, "n1", "n4"); !ok || err != nil {
			t.Fatalf("AdoptFilesPaused: %v %v", ok, err)
		}
		if ok, _ := s.AdoptFilesPaused(ctx, sb.ID, "n1", "n5"); ok {
			t.Fatal("adopted from a node that no longer hosts it")
		}
		if ok, err := s.FinishFilesPause(ctx, sb.ID, t0.Add(time.Second)); !ok || err != nil {
			t.Fatalf("FinishFilesPause: %v %v", ok, err)
		}
		got, _ := s.GetSandbox(ctx, sb.ID)
		if got.Pause != store.PausePaused || !got.PausedFiles || got.TemplateID != "tpl_saved" || got.NodeID != "n4" {
			t.Fatalf("paused row %+v", got)
		}
		evs, err := s.ListEvents(ctx, store.EventFilter{AccountID: a.ID, SandboxID: sb.ID, Types: []string{store.EventPaused}, Limit: 10})
		if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Data), `"memory":false`) || !strings.Contains(string(evs[0].Data), "tpl_saved") {
			t.Fatalf("paused events %+v %v", evs, err)
		}
		if ok, err := s.ClaimFilesResume(ctx, sb.ID, "n2", t0.Add(2*time.Second)); !ok || err != nil {
			t.Fatalf("ClaimFilesResume: %v %v", ok, err)
		}
		if ok, _ := s.ClaimFilesResume(ctx, sb.ID, "n3", t0.Add(2*time.Second)); ok {
			t.Fatal("resume claimed twice")
		}
		if ok, err := s.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, "", t0.Add(3*time.Second)); !ok || err != nil {
			t.Fatalf("resuming -> running: %v %v", ok, err)
		}
		got, _ = s.GetSandbox(ctx, sb.ID)
		if got.Pause != "" || got.PausedFiles || got.NodeID != "n2" || got.TemplateID != "tpl_saved" {
			t.Fatalf("resumed row %+v", got)
		}
		// A pause with its memory is not one a node claims.
		if ok, _ := s.BeginPause(ctx, sb.ID, t0); !ok {
			t.Fatal("BeginPause again")
		}
		if ok, _ := s.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, store.PausePaused, t0); !ok {
			t.Fatal("pausing -> paused")
		}
		if ok, _ := s.ClaimFilesResume(ctx, sb.ID, "n3", t0); ok {
			t.Fatal("a memory pause claimed by another node")
		}
	})
}

// TestPausedBefore: a sandbox counts as paused from its BeginPause until a
// resume ends the pause; the list names this node's paused sandboxes whose
// pause began by the cutoff, and BeginStopPaused stops one only while that
// is still so (not once a resume claimed it, nor after it paused again).
func TestPausedBefore(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "sleeper")
		pause := func(id string, at time.Time) {
			t.Helper()
			if ok, err := s.BeginPause(ctx, id, at); !ok || err != nil {
				t.Fatalf("BeginPause %s: %v %v", id, ok, err)
			}
			if ok, err := s.TransitionPause(ctx, id, []string{store.PausePausing}, store.PausePaused, at); !ok || err != nil {
				t.Fatalf("pausing -> paused %s: %v %v", id, ok, err)
			}
		}
		ids := func(sbs []store.Sandbox) []string {
			var out []string
			for _, sb := range sbs {
				out = append(out, sb.ID)
			}
			return out
		}
		old := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		recent := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		elsewhere := mustSandbox(t, s, a.ID, "n2", store.SandboxRunning, t0)
		pausing := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		running := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		pause(old.ID, t0)
		pause(recent.ID, t0.Add(time.Hour))
		pause(elsewhere.ID, t0)
		if ok, _ := s.BeginPause(ctx, pausing.ID, t0); !ok {
			t.Fatal("BeginPause")
		}
		cutoff := t0.Add(time.Minute)
		got, err := s.ListPausedBefore(ctx, "n1", cutoff)
		if err != nil || !slices.Equal(ids(got), []string{old.ID}) {
			t.Fatalf("paused before the cutoff on n1: %v %v, want [%s] (not %s, %s, %s, %s)", ids(got), err, old.ID, recent.ID, elsewhere.ID, pausing.ID, running.ID)
		}
		if got, _ := s.ListPausedBefore(ctx, "", cutoff); len(got) != 2 {
			t.Fatalf("paused before the cutoff anywhere: %v", ids(got))
		}

		// A resume that claimed it first wins; so does a new pause.
		if ok, _ := s.TransitionPause(ctx, old.ID, []string{store.PausePaused}, store.PauseResuming, t0.Add(2*time.Hour)); !ok {
			t.Fatal("paused -> resuming")
		}
		if ok, err := s.BeginStopPaused(ctx, old.ID, cutoff, "too long", t0.Add(2*time.Hour)); ok || err != nil {
			t.Fatalf("stop of a sandbox being resumed: %v %v", ok, err)
		}
		if ok, _ := s.TransitionPause(ctx, old.ID, []string{store.PauseResuming}, "", t0.Add(2*time.Hour)); !ok {
			t.Fatal("resuming -> running")
		}
		if got, _ := s.ListPausedBefore(ctx, "n1", t0.Add(3*time.Hour)); !slices.Equal(ids(got), []string{recent.ID}) {
			t.Fatalf("after the resume: %v, want only %s", ids(got), recent.ID)
		}
		pause(old.ID, t0.Add(3*time.Hour))
		if ok, err := s.BeginStopPaused(ctx, old.ID, cutoff, "too long", t0.Add(3*time.Hour)); ok || err != nil {
			t.Fatalf("stop of a sandbox paused again since: %v %v", ok, err)
		}

		if ok, err := s.BeginStopPaused(ctx, recent.ID, t0.Add(2*time.Hour), "too long", t0.Add(3*time.Hour)); !ok || err != nil {
			t.Fatalf("stop of a sandbox paused too long: %v %v", ok, err)
		}
		if got, _ := s.GetSandbox(ctx, recent.ID); got.Status != store.SandboxStopping || got.FailureReason != "too long" {
			t.Fatalf("stopped paused sandbox: %s %q", got.Status, got.FailureReason)
		}
		if ok, _ := s.BeginStopPaused(ctx, recent.ID, t0.Add(2*time.Hour), "too long", t0.Add(3*time.Hour)); ok {
			t.Fatal("stopped twice")
		}
	})
}
