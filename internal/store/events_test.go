package store_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestEvents: a sandbox's changes are recorded as events by the queries
// that make them (created, running, updated, paused, resumed, a run
// finished, stopped with its reason), never for what changes nothing
// (a pause undone, a transition that did not apply); each event makes a
// pending delivery for every enabled webhook of its account that takes its
// type; a claim moves them to queued once; an attempt is recorded while
// queued; deleting a webhook cancels its undelivered ones; old events go
// with their ended deliveries.
func TestEvents(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		all := store.Webhook{AccountID: alice.ID, URL: "https://hooks.example/all", Secret: "sealed", Enabled: true}
		stops := store.Webhook{AccountID: alice.ID, URL: "https://hooks.example/stops", Secret: "sealed", Enabled: true, Events: []string{store.EventStopped, store.EventFailed}}
		off := store.Webhook{AccountID: alice.ID, URL: "https://hooks.example/off", Secret: "sealed", Enabled: false}
		bobs := store.Webhook{AccountID: bob.ID, URL: "https://hooks.example/bob", Secret: "sealed", Enabled: true}
		for _, w := range []*store.Webhook{&all, &stops, &off, &bobs} {
			if err := s.CreateWebhook(ctx, w); err != nil {
				t.Fatal(err)
			}
		}

		// now is the time of each change: later than the one before, by a
		// millisecond at least (events are ordered by time, then id).
		now := func() time.Time {
			time.Sleep(2 * time.Millisecond)
			return time.Now()
		}
		sb := store.Sandbox{AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor", Deadline: t0.Add(time.Hour), CreatedAt: now()}
		if err := s.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		step := func(what string, ok bool, err error) {
			t.Helper()
			if err != nil || !ok {
				t.Fatalf("%s: %v %v", what, ok, err)
			}
		}
		ok, err := s.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", now())
		step("running", ok, err)
		// Not applied: no event.
		if ok, _ := s.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", t0); ok {
			t.Fatal("a second pending → running applied")
		}
		now()
		if err := s.SetSandboxDeadline(ctx, sb.ID, t0.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		ok, err = s.BeginPause(ctx, sb.ID, now())
		step("begin pause", ok, err)
		ok, err = s.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, "", now()) // undone: no event
		step("pause undone", ok, err)
		ok, err = s.BeginPause(ctx, sb.ID, now())
		step("begin pause again", ok, err)
		ok, err = s.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, store.PausePaused, now())
		step("paused", ok, err)
		ok, err = s.TransitionPause(ctx, sb.ID, []string{store.PausePaused}, store.PauseResuming, now())
		step("resuming", ok, err)
		ok, err = s.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, "", now())
		step("resumed", ok, err)
		run := store.Run{AccountID: alice.ID, SandboxID: sb.ID, Task: "run-sandbox-command", Payload: json.RawMessage(`{}`)}
		if err := s.CreateRun(ctx, &run); err != nil {
			t.Fatal(err)
		}
		ok, err = s.FinishRun(ctx, run.ID, store.RunCompleted, json.RawMessage(`{}`), nil, now())
		step("run finished", ok, err)
		ok, err = s.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopping, "stopped by request", now())
		step("stopping", ok, err)
		ok, err = s.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxStopping}, store.SandboxStopped, "", now())
		step("stopped", ok, err)
		if err := s.RecordEvent(ctx, "gone", store.EventSnapshot, nil); err != nil {
			t.Fatalf("an event of a sandbox that is gone: %v", err)
		}

		events, err := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, SandboxID: sb.ID, Limit: 100, Asc: true})
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, e := range events {
			types = append(types, e.Type)
		}
		want := []string{store.EventCreated, store.EventRunning, store.EventUpdated, store.EventPaused, store.EventResumed, store.EventRunFinished, store.EventStopped}
		if !slices.Equal(types, want) {
			t.Fatalf("events %v, want %v", types, want)
		}
		if last := events[len(events)-1]; !strings.Contains(string(last.Data), `"reason":"stopped by request"`) {
			t.Fatalf("stopped's data %s", last.Data)
		}
		if fin := events[5]; !strings.Contains(string(fin.Data), `"run_id":"`+run.ID+`"`) || !strings.Contains(string(fin.Data), `"status":"COMPLETED"`) {
			t.Fatalf("run.finished's data %s", fin.Data)
		}
		// Newest first by default, paged by cursor and by offset, by type.
		newest, _ := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, Limit: 2})
		if len(newest) != 2 || newest[0].Type != store.EventStopped {
			t.Fatalf("newest first: %+v", newest)
		}
		next, _ := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, Limit: 100, After: newest[1].Cursor()})
		if len(next) != len(want)-2 || next[0].Type != want[len(want)-3] {
			t.Fatalf("after the first page: %+v", next)
		}
		skipped, _ := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, Limit: 1, Offset: 1})
		if len(skipped) != 1 || skipped[0].ID != newest[1].ID {
			t.Fatalf("offset 1: %+v", skipped)
		}
		paused, _ := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, Types: []string{store.EventPaused, store.EventResumed}, Limit: 10})
		if len(paused) != 2 {
			t.Fatalf("by type: %+v", paused)
		}
		if none, _ := s.ListEvents(ctx, store.EventFilter{AccountID: bob.ID, Limit: 10}); len(none) != 0 {
			t.Fatalf("bob's events: %+v", none)
		}

		// Deliveries: every event to all, two to stops, none to off or bob's.
		count := func(w store.Webhook) int {
			t.Helper()
			ds, err := s.ListDeliveries(ctx, w.ID, 100)
			if err != nil {
				t.Fatal(err)
			}
			return len(ds)
		}
		if n := count(all); n != len(want) {
			t.Fatalf("all has %d deliveries, want %d", n, len(want))
		}
		if n := count(stops); n != 1 {
			t.Fatalf("stops has %d deliveries, want 1", n)
		}
		if count(off)+count(bobs) != 0 {
			t.Fatal("a disabled webhook or another account's has deliveries")
		}
		var claimed []string
		if err := s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
			claimed, err = q.ClaimPendingDeliveries(ctx, 3)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(claimed) != 3 {
			t.Fatalf("claimed %v", claimed)
		}
		if _, err := s.ClaimPendingDeliveries(ctx, 1); err == nil {
			t.Fatal("a claim outside a transaction")
		}
		ok, err = s.RecordDeliveryAttempt(ctx, claimed[0], store.DeliveryDelivered, 1, 204, "")
		step("delivered", ok, err)
		if ok, _ := s.RecordDeliveryAttempt(ctx, claimed[0], store.DeliveryFailed, 2, 500, "x"); ok {
			t.Fatal("an attempt recorded on a delivery no longer queued")
		}
		d, err := s.GetDelivery(ctx, claimed[0])
		if err != nil || d.Status != store.DeliveryDelivered || d.ResponseStatus != 204 || d.Attempts != 1 {
			t.Fatalf("delivery %+v %v", d, err)
		}
		if err := s.DeleteWebhook(ctx, all.ID); err != nil {
			t.Fatal(err)
		}
		left, _ := s.ListDeliveries(ctx, all.ID, 100)
		for _, d := range left {
			if d.ID != claimed[0] && d.Status != store.DeliveryCancelled {
				t.Fatalf("a delivery of a deleted webhook is %s", d.Status)
			}
		}
		if err := s.DeleteWebhook(ctx, all.ID); err == nil {
			t.Fatal("a webhook deleted twice")
		}

		// Old events go with their ended deliveries; the one still pending
		// (stops's) keeps its event.
		if _, err := s.DeleteEventsBefore(ctx, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		rest, _ := s.ListEvents(ctx, store.EventFilter{AccountID: alice.ID, Limit: 100})
		if len(rest) != 1 || rest[0].Type != store.EventStopped {
			t.Fatalf("after the sweep: %+v", rest)
		}
	})
}

// TestTagKinds: a snapshot never takes a template's name:tag, nor a
// template a snapshot's: the move is refused where it is made.
func TestTagKinds(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteDSN(t))
	ctx := t.Context()
	alice := mustAccount(t, s, store.AccountPersonal, "Alice")
	tpl := store.Template{AccountID: alice.ID, Name: "x", Tag: "latest", Status: store.TemplateReady, Source: "registry.example/x"}
	if err := s.CreateTemplate(ctx, &tpl); err != nil {
		t.Fatal(err)
	}
	snap := store.Template{ID: store.NewID("tpl_"), AccountID: alice.ID, Name: "x", Status: store.TemplateReady, Source: "sandbox:sbx_1", Kind: store.TemplateKindSnapshot}
	snap.Tag = store.UntaggedTag(snap.ID)
	if err := s.CreateTemplate(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.TagTemplate(ctx, snap.ID, "latest"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a snapshot takes a template's tag: %v", err)
	}
	if got, _ := s.FindTemplate(ctx, alice.ID, "x", "latest"); got.ID != tpl.ID {
		t.Fatalf("x:latest is now %s", got.ID)
	}
	if _, _, err := s.TagTemplate(ctx, snap.ID, "v2"); err != nil {
		t.Fatalf("a free tag: %v", err)
	}
}
