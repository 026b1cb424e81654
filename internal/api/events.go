package api

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// EventService lists an account's lifecycle events and keeps its webhooks
// (internal/webhooks). Every method acts on an account the caller may act
// for (resolved by the route).
type EventService interface {
	Events(ctx context.Context, f store.EventFilter) ([]store.Event, error)
	Create(ctx context.Context, accountID string, spec webhooks.Spec) (store.Webhook, string, error)
	List(ctx context.Context, accountID string) ([]store.Webhook, error)
	Get(ctx context.Context, accountID, id string) (store.Webhook, error)
	Update(ctx context.Context, accountID, id string, spec webhooks.Spec) (store.Webhook, error)
	Delete(ctx context.Context, accountID, id string) (store.Webhook, error)
	Deliveries(ctx context.Context, accountID, id string, limit int) ([]store.Delivery, error)
}

// readsWebhooks is why a sandbox's own key may not read the account's
// webhooks (route.acts): the code in the sandbox is untrusted, and a
// webhook's URL may carry its receiver's token.
const readsWebhooks = "it reads the account's webhooks, whose URLs may carry their receivers' tokens"

// listEvents is GET /api/events: the account's events, paged.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	q, account, err := bindQuery(s, w, r, contract.ParseEventsQuery)
	if err != nil {
		return err
	}
	if s.opts.Events == nil {
		return errNotAvailable
	}
	f := q.Filter(account)
	f.Limit++ // one more says whether a page follows
	events, err := s.opts.Events.Events(r.Context(), f)
	if err != nil {
		return err
	}
	if len(events) > q.Limit {
		events = events[:q.Limit]
		setNextCursor(w, events[len(events)-1].Cursor())
	}
	resp := contract.EventsResponse{Status: "success", Events: make([]contract.Event, 0, len(events))}
	for _, e := range events {
		resp.Events = append(resp.Events, contract.EventView(e))
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// webhookSpec is the service's spec of a request's fields.
func webhookSpec(req contract.WebhookRequest) webhooks.Spec {
	var spec webhooks.Spec
	if req.Has("url") {
		spec.URL = &req.URL
	}
	if req.Has("name") {
		spec.Name = &req.Name
	}
	if req.Has("secret") {
		spec.Secret = &req.Secret
	}
	if req.Has("events") {
		spec.Events = &req.Events
	}
	spec.Enabled = req.Enabled
	return spec
}

// createWebhook is POST /api/webhooks: answers the webhook and its secret
// (once).
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseWebhook)
	if err != nil {
		return err
	}
	if s.opts.Events == nil {
		return errNotAvailable
	}
	if !req.Has("url") {
		return contract.FieldError("url: required", "url")
	}
	wh, secret, err := s.opts.Events.Create(r.Context(), account, webhookSpec(req))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.WebhookResponse{Status: "success", Webhook: contract.WebhookView(wh), Secret: secret})
	return nil
}

// listWebhooks is GET /api/webhooks.
func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) error {
	_, account, err := bindQuery(s, w, r, contract.ParseDeliveriesQuery)
	if err != nil {
		return err
	}
	if s.opts.Events == nil {
		return errNotAvailable
	}
	list, err := s.opts.Events.List(r.Context(), account)
	if err != nil {
		return err
	}
	resp := contract.WebhooksResponse{Status: "success", Webhooks: make([]contract.Webhook, 0, len(list))}
	for _, wh := range list {
		resp.Webhooks = append(resp.Webhooks, contract.WebhookView(wh))
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// webhookAccount is the account a webhook route's query acts for.
func (s *Server) webhookAccount(w http.ResponseWriter, r *http.Request) (contract.DeliveriesQuery, string, error) {
	q, account, err := bindQuery(s, w, r, contract.ParseDeliveriesQuery)
	if err == nil && s.opts.Events == nil {
		err = errNotAvailable
	}
	return q, account, err
}

// getWebhook is GET /api/webhooks/{id}.
func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) error {
	_, account, err := s.webhookAccount(w, r)
	if err != nil {
		return err
	}
	wh, err := s.opts.Events.Get(r.Context(), account, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.WebhookResponse{Status: "success", Webhook: contract.WebhookView(wh)})
	return nil
}

// updateWebhook is PATCH /api/webhooks/{id}.
func (s *Server) updateWebhook(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseWebhook)
	if err != nil {
		return err
	}
	if s.opts.Events == nil {
		return errNotAvailable
	}
	wh, err := s.opts.Events.Update(r.Context(), account, chi.URLParam(r, "id"), webhookSpec(req))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.WebhookResponse{Status: "success", Webhook: contract.WebhookView(wh)})
	return nil
}

// deleteWebhook is DELETE /api/webhooks/{id}: answers it as it was.
func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) error {
	_, account, err := s.webhookAccount(w, r)
	if err != nil {
		return err
	}
	wh, err := s.opts.Events.Delete(r.Context(), account, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.WebhookResponse{Status: "success", Webhook: contract.WebhookView(wh)})
	return nil
}

// listDeliveries is GET /api/webhooks/{id}/deliveries.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	q, account, err := s.webhookAccount(w, r)
	if err != nil {
		return err
	}
	ds, err := s.opts.Events.Deliveries(r.Context(), account, chi.URLParam(r, "id"), q.Limit)
	if err != nil {
		return err
	}
	resp := contract.DeliveriesResponse{Status: "success", Deliveries: make([]contract.Delivery, 0, len(ds))}
	for _, d := range ds {
		resp.Deliveries = append(resp.Deliveries, contract.DeliveryView(d))
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}
