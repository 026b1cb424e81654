package e2b

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// TestEventsRoutes: E2B's events API answers the caller's events that E2B
// has a type for, in E2B's shape, newest first, paged by offset and limit
// (orderAsc oldest first); another account's sandbox is 404 and its events
// are not listed; webhooks are registered (201, E2B's shape, no secret),
// listed, changed, deleted, and another account's is 404.
func TestEventsRoutes(t *testing.T) {
	securitytest.Attack(t, "e2b", "another account reads alice's sandbox's lifecycle events, or reads, changes or deletes her webhook, through E2B's events API",
		"404 and empty lists: events and webhooks are looked up within the caller's account")
	f := newFixture(t, func(o *fixtureOptions) {
		svc, err := webhooks.New(webhooks.Config{Store: o.Store.(*store.Store), Key: bytes.Repeat([]byte{1}, 32)})
		if err != nil {
			t.Fatal(err)
		}
		o.Events = svc
	})
	alice := map[string]string{"X-API-Key": f.key}
	bob := map[string]string{"X-API-Key": f.otherKey}
	sb := f.create(f.key, map[string]any{"templateID": "base", "metadata": map[string]string{"team": "a"}})
	// A new timeout (the fake manager records none: set as the real one
	// does).
	time.Sleep(2 * time.Millisecond)
	if err := f.st.SetSandboxDeadline(t.Context(), envd.SandboxID(sb.SandboxID), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}

	var events []webhooks.E2BEvent
	if resp := f.call("GET", "/events/sandboxes/"+sb.SandboxID, alice, nil, &events); resp.StatusCode != 200 {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	if len(events) != 2 || events[0].Type != "sandbox.lifecycle.updated" || events[1].Type != "sandbox.lifecycle.created" {
		t.Fatalf("events %+v", events)
	}
	created := events[1]
	if created.SandboxID != sb.SandboxID || created.SandboxID != envd.E2BID(envd.SandboxID(sb.SandboxID)) || created.SandboxTemplateID != "base" ||
		created.EventData["sandbox_metadata"].(map[string]any)["team"] != "a" || created.Version != "v1" {
		t.Fatalf("created %+v", created)
	}
	if _, ok := events[0].EventData["set_timeout"]; !ok {
		t.Fatalf("updated's data %+v", events[0].EventData)
	}
	var page []webhooks.E2BEvent
	f.call("GET", "/events/sandboxes?limit=1&offset=1&orderAsc=true", alice, nil, &page)
	if len(page) != 1 || page[0].Type != "sandbox.lifecycle.updated" {
		t.Fatalf("page %+v", page)
	}
	for _, q := range []string{"limit=0", "offset=-1", "orderAsc=maybe"} {
		if resp := f.call("GET", "/events/sandboxes?"+q, alice, nil, nil); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d", q, resp.StatusCode)
		}
	}
	if resp := f.call("GET", "/events/sandboxes/"+sb.SandboxID, bob, nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("bob reads alice's sandbox's events: %d", resp.StatusCode)
	}
	var bobs []webhooks.E2BEvent
	if f.call("GET", "/events/sandboxes", bob, nil, &bobs); len(bobs) != 0 {
		t.Fatalf("bob lists %+v", bobs)
	}

	var wh webhook
	body := map[string]any{"name": "mine", "url": "https://hooks.example/in", "enabled": true,
		"events": []string{"sandbox.lifecycle.created", "sandbox.lifecycle.killed"}, "signatureSecret": "secret-for-event-signature"}
	if resp := f.call("POST", "/events/webhooks", alice, body, &wh); resp.StatusCode != http.StatusCreated {
		t.Fatalf("register: %d", resp.StatusCode)
	}
	if wh.Name != "mine" || !wh.Enabled || len(wh.Events) != 2 || wh.Events[0] != "sandbox.lifecycle.created" || wh.Events[1] != "sandbox.lifecycle.killed" || wh.TeamID == "" {
		t.Fatalf("webhook %+v", wh)
	}
	var e envd.Error
	for _, bad := range []map[string]any{{"url": "http://127.0.0.1/x"}, {"url": "https://hooks.example/in", "events": []string{"sandbox.lifecycle.exploded"}}, {"name": "no url"}} {
		if resp := f.call("POST", "/events/webhooks", alice, bad, &e); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("register %v: %d %+v", bad, resp.StatusCode, e)
		}
	}
	var list []webhook
	if f.call("GET", "/events/webhooks", alice, nil, &list); len(list) != 1 || list[0].ID != wh.ID {
		t.Fatalf("list %+v", list)
	}
	var changed webhook
	if resp := f.call("PATCH", "/events/webhooks/"+wh.ID, alice, map[string]any{"enabled": false, "events": []string{"sandbox.lifecycle.paused"}}, &changed); resp.StatusCode != 200 ||
		changed.Enabled || len(changed.Events) != 1 || changed.Events[0] != "sandbox.lifecycle.paused" || changed.URL != "https://hooks.example/in" {
		t.Fatalf("change: %d %+v", resp.StatusCode, changed)
	}
	for _, m := range []string{"GET", "PATCH", "DELETE"} {
		if resp := f.call(m, "/events/webhooks/"+wh.ID, bob, map[string]any{"enabled": true}, nil); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("bob %s alice's webhook: %d", m, resp.StatusCode)
		}
	}
	if resp := f.call("DELETE", "/events/webhooks/"+wh.ID, alice, nil, nil); resp.StatusCode != 200 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if resp := f.call("GET", "/events/webhooks/"+wh.ID, alice, nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("get after delete: %d", resp.StatusCode)
	}
}
