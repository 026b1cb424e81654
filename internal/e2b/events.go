package e2b

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// E2B's lifecycle events API (GET /events/sandboxes[/{id}]) and its
// webhooks (/events/webhooks), over sandboxd's events and webhooks
// (internal/webhooks): the events E2B has a type for, in E2B's shape; a
// webhook registered here gets E2B's payload and e2b-signature.

// Events is what the events routes use (package webhooks' Service).
type Events interface {
	Events(ctx context.Context, f store.EventFilter) ([]store.Event, error)
	Create(ctx context.Context, accountID string, spec webhooks.Spec) (store.Webhook, string, error)
	List(ctx context.Context, accountID string) ([]store.Webhook, error)
	Get(ctx context.Context, accountID, id string) (store.Webhook, error)
	Update(ctx context.Context, accountID, id string, spec webhooks.Spec) (store.Webhook, error)
	Delete(ctx context.Context, accountID, id string) (store.Webhook, error)
}

// eventsOf answers the caller's events (of one sandbox when sandboxID is
// not "") with E2B's paging: offset (0 and up), limit (1 to 100, default
// 10), orderAsc (default false: newest first).
func (a *API) eventsOf(w http.ResponseWriter, r *http.Request, c edge.Caller, sandboxID string) error {
	if a.opts.Events == nil {
		return edge.Errorf(http.StatusNotFound, "this server keeps no events")
	}
	q := r.URL.Query()
	f := store.EventFilter{AccountID: c.AccountID, SandboxID: sandboxID, Types: webhooks.E2BTypes(), Limit: 10}
	var err error
	if s := q.Get("offset"); s != "" {
		if f.Offset, err = strconv.Atoi(s); err != nil || f.Offset < 0 {
			return edge.Errorf(http.StatusBadRequest, "offset must be 0 or more")
		}
	}
	if s := q.Get("limit"); s != "" {
		if f.Limit, err = strconv.Atoi(s); err != nil || f.Limit < 1 || f.Limit > 100 {
			return edge.Errorf(http.StatusBadRequest, "limit must be 1 to 100")
		}
	}
	if s := q.Get("orderAsc"); s != "" {
		if f.Asc, err = strconv.ParseBool(s); err != nil {
			return edge.Errorf(http.StatusBadRequest, "orderAsc must be true or false")
		}
	}
	events, err := a.opts.Events.Events(r.Context(), f)
	if err != nil {
		return err
	}
	out := make([]webhooks.E2BEvent, 0, len(events))
	records := map[string]store.E2BSandbox{}
	for _, e := range events {
		rec, ok := records[e.SandboxID]
		if !ok {
			rec, _ = a.opts.Store.GetE2BSandbox(r.Context(), e.SandboxID)
			records[e.SandboxID] = rec
		}
		out = append(out, webhooks.ToE2B(e, rec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listEvents is GET /events/sandboxes: the caller's sandboxes' events.
func (a *API) listEvents(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	return a.eventsOf(w, r, c, "")
}

// sandboxEvents is GET /events/sandboxes/{id}: one sandbox's events, also
// after it was killed (404 only for one the caller never had).
func (a *API) sandboxEvents(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	id := envd.SandboxID(chi.URLParam(r, "id"))
	sb, err := a.opts.Store.GetSandbox(r.Context(), id)
	if err != nil || sb.AccountID != c.AccountID {
		return edge.Errorf(http.StatusNotFound, "sandbox %q not found", chi.URLParam(r, "id"))
	}
	return a.eventsOf(w, r, c, id)
}

// webhook is E2B's webhook as its API answers it (never the secret).
type webhook struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
}

func webhookOf(wh store.Webhook) webhook {
	out := webhook{ID: wh.ID, TeamID: wh.AccountID, Name: wh.Name, CreatedAt: wh.CreatedAt, Enabled: wh.Enabled, URL: wh.URL, Events: []string{}}
	for _, t := range wh.Events {
		if n := webhooks.E2BType(t); n != "" && (len(out.Events) == 0 || out.Events[len(out.Events)-1] != n) {
			out.Events = append(out.Events, n)
		}
	}
	return out
}

// webhookRequest is E2B's body of a webhook's registration and change.
type webhookRequest struct {
	Name            *string   `json:"name"`
	URL             *string   `json:"url"`
	Enabled         *bool     `json:"enabled"`
	Events          *[]string `json:"events"`
	SignatureSecret *string   `json:"signatureSecret"`
}

func (req webhookRequest) spec() webhooks.Spec {
	return webhooks.Spec{Name: req.Name, URL: req.URL, Enabled: req.Enabled, Events: req.Events, Secret: req.SignatureSecret, Format: store.WebhookFormatE2B}
}

// createWebhook is POST /events/webhooks: 201 with the webhook.
func (a *API) createWebhook(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	if a.opts.Events == nil {
		return edge.Errorf(http.StatusNotFound, "this server has no webhooks")
	}
	var req webhookRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.URL == nil {
		return edge.Errorf(http.StatusBadRequest, "url: required")
	}
	wh, _, err := a.opts.Events.Create(r.Context(), c.AccountID, req.spec())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, webhookOf(wh))
	return nil
}

// listWebhooks is GET /events/webhooks: the caller's webhooks, E2B's and
// sandboxd's.
func (a *API) listWebhooks(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	out := []webhook{}
	if a.opts.Events != nil {
		list, err := a.opts.Events.List(r.Context(), c.AccountID)
		if err != nil {
			return err
		}
		for _, wh := range list {
			out = append(out, webhookOf(wh))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// oneWebhook answers webhook {webhookID} of the caller after do (nil:
// nothing) acted on it.
func (a *API) oneWebhook(w http.ResponseWriter, r *http.Request, c edge.Caller, do func(id string) (store.Webhook, error)) error {
	if a.opts.Events == nil {
		return edge.Errorf(http.StatusNotFound, "this server has no webhooks")
	}
	wh, err := do(chi.URLParam(r, "webhookID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, webhookOf(wh))
	return nil
}

// getWebhook is GET /events/webhooks/{webhookID}.
func (a *API) getWebhook(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	return a.oneWebhook(w, r, c, func(id string) (store.Webhook, error) { return a.opts.Events.Get(r.Context(), c.AccountID, id) })
}

// updateWebhook is PATCH /events/webhooks/{webhookID}: the fields given
// replace the webhook's.
func (a *API) updateWebhook(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req webhookRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	return a.oneWebhook(w, r, c, func(id string) (store.Webhook, error) {
		cur, err := a.opts.Events.Get(r.Context(), c.AccountID, id)
		if err != nil {
			return cur, err
		}
		spec := req.spec()
		spec.Format = cur.Format // a change keeps the webhook's format
		return a.opts.Events.Update(r.Context(), c.AccountID, id, spec)
	})
}

// deleteWebhook is DELETE /events/webhooks/{webhookID}: 200 with it.
func (a *API) deleteWebhook(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	return a.oneWebhook(w, r, c, func(id string) (store.Webhook, error) { return a.opts.Events.Delete(r.Context(), c.AccountID, id) })
}
