package contract

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Lifecycle events and webhooks (sandboxd; internal/webhooks).

// EventsQuery is the query of GET /api/events.
type EventsQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"description=Only this sandbox's events"`
	Type      string `json:"type,omitempty" jsonschema:"description=Only events of these types, comma-separated: sandbox.created, sandbox.running, sandbox.paused, sandbox.resumed, sandbox.updated, sandbox.snapshot, run.finished, sandbox.stopped, sandbox.failed"`
	Order     string `json:"order,omitempty" jsonschema:"enum=desc,enum=asc,default=desc,description=desc: newest first; asc: oldest first"`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=50"`
	Cursor    string `json:"cursor,omitempty" jsonschema:"description=The X-Next-Cursor of the previous page"`
	Since     string `json:"since,omitempty" jsonschema:"format=date-time,description=Only events recorded at or after this time (RFC 3339)"`
	types     []string
	after     store.Cursor
	since     time.Time
}

// ActingFor implements ActsFor.
func (q EventsQuery) ActingFor() string { return q.AccountID }

// Filter is the query as the store's filter of account's events.
func (q EventsQuery) Filter(account string) store.EventFilter {
	return store.EventFilter{AccountID: account, SandboxID: q.SandboxID, Types: q.types, After: q.after, Limit: q.Limit, Asc: q.Order == "asc", Since: q.since}
}

// ParseEventsQuery validates the query of GET /api/events.
func ParseEventsQuery(v url.Values) (EventsQuery, error) {
	q := EventsQuery{Order: "desc", SandboxID: v.Get("sandbox_id"), Type: v.Get("type"), Cursor: v.Get("cursor"), Since: v.Get("since")}
	var err error
	if q.Since != "" {
		if q.since, err = time.Parse(time.RFC3339Nano, q.Since); err != nil {
			return q, BadRequest("since must be a date-time (RFC 3339)")
		}
	}
	if q.AccountID, err = QueryAccountID(v); err != nil {
		return q, err
	}
	if q.Limit, err = QueryLimit(v, 50); err != nil {
		return q, err
	}
	if o := v.Get("order"); o != "" {
		if o != "asc" && o != "desc" {
			return q, BadRequest("order must be asc or desc")
		}
		q.Order = o
	}
	var bad *edge.Error
	if q.types, bad = ParseEventTypes(q.Type); bad != nil {
		return q, bad
	}
	q.after, err = QueryCursor(q.Cursor)
	return q, err
}

// ParseEventTypes reads a comma-separated list of event types (GET
// /api/events' and list_events' type); an unknown one is 400.
func ParseEventTypes(s string) ([]string, *edge.Error) {
	var types []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if !slices.Contains(store.EventTypes, t) {
			return nil, BadRequest("type " + t + " is not an event type (" + strings.Join(store.EventTypes, ", ") + ")")
		}
		types = append(types, t)
	}
	return types, nil
}

// Event is one lifecycle event.
type Event struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	SandboxID string `json:"sandbox_id"`
	// Data is what the change was: a stop's reason, a new timeout, the
	// run that finished, the snapshot taken.
	Data      map[string]any `json:"data,omitempty"`
	CreatedAt string         `json:"created_at" jsonschema:"format=date-time"`
}

// EventView renders e.
func EventView(e store.Event) Event {
	v := Event{ID: e.ID, Type: e.Type, SandboxID: e.SandboxID, CreatedAt: FormatTime(e.CreatedAt)}
	if len(e.Data) > 0 {
		_ = json.Unmarshal(e.Data, &v.Data)
	}
	return v
}

// EventsResponse answers GET /api/events.
type EventsResponse struct {
	Status string  `json:"status" jsonschema:"enum=success"`
	Events []Event `json:"events"`
}

// WebhookRequest is the body of POST /api/webhooks and PATCH
// /api/webhooks/{id}: on a PATCH, a field left out stays as it is.
type WebhookRequest struct {
	URL       string   `json:"url,omitempty" jsonschema:"format=uri,description=Where events are POSTed (http or https; required to register). Private and loopback addresses are refused unless the server allows them"`
	Name      string   `json:"name,omitempty" jsonschema:"maxLength=256"`
	Events    []string `json:"events,omitempty" jsonschema:"description=The event types it takes (GET /api/events' types); absent or empty: all"`
	Secret    string   `json:"secret,omitempty" jsonschema:"minLength=16,maxLength=512,description=The signing secret; absent at registration: one is made and answered once"`
	Enabled   *bool    `json:"enabled,omitempty" jsonschema:"description=Whether events are delivered (default true)"`
	AccountID string   `json:"account_id,omitempty" jsonschema:"format=uuid"`
	has       map[string]bool
}

// ActingFor implements ActsFor.
func (r WebhookRequest) ActingFor() string { return r.AccountID }

// Has reports whether the body gave field name.
func (r WebhookRequest) Has(name string) bool { return r.has[name] }

// ParseWebhook validates the body of POST /api/webhooks and PATCH
// /api/webhooks/{id}; the webhooks service checks the values.
func ParseWebhook(a Args) (WebhookRequest, error) {
	o := a.o
	req := WebhookRequest{has: map[string]bool{}}
	var err error
	for _, name := range []string{"url", "name", "secret"} {
		s, ok, err := o.str(name)
		if err != nil {
			return req, err
		}
		req.has[name] = ok
		switch name {
		case "url":
			req.URL = s
		case "name":
			req.Name = s
		case "secret":
			req.Secret = s
		}
	}
	if req.Events, req.has["events"], err = o.strings("events"); err != nil {
		return req, err
	}
	b, ok, err := o.bool("enabled")
	if err != nil {
		return req, err
	}
	if ok {
		req.Enabled, req.has["enabled"] = &b, true
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// Webhook is a webhook as the API answers it: never its secret.
type Webhook struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	URL       string   `json:"url"`
	Events    []string `json:"events" jsonschema:"description=The types it takes; empty: all"`
	Format    string   `json:"format" jsonschema:"enum=sandboxd,enum=e2b"`
	Enabled   bool     `json:"enabled"`
	CreatedAt string   `json:"created_at" jsonschema:"format=date-time"`
	UpdatedAt string   `json:"updated_at" jsonschema:"format=date-time"`
}

// WebhookView renders w.
func WebhookView(w store.Webhook) Webhook {
	return Webhook{ID: w.ID, Name: w.Name, URL: w.URL, Events: orEmpty(w.Events), Format: w.Format, Enabled: w.Enabled,
		CreatedAt: FormatTime(w.CreatedAt), UpdatedAt: FormatTime(w.UpdatedAt)}
}

// WebhookResponse answers the routes of one webhook; Secret only at its
// registration.
type WebhookResponse struct {
	Status  string  `json:"status" jsonschema:"enum=success"`
	Webhook Webhook `json:"webhook"`
	Secret  string  `json:"secret,omitempty" jsonschema:"description=The signing secret, answered once: at registration"`
}

// WebhooksResponse answers GET /api/webhooks.
type WebhooksResponse struct {
	Status   string    `json:"status" jsonschema:"enum=success"`
	Webhooks []Webhook `json:"webhooks"`
}

// Delivery is one event's delivery to a webhook.
type Delivery struct {
	ID      string `json:"id"`
	EventID string `json:"event_id"`
	Status  string `json:"status" jsonschema:"enum=pending,enum=queued,enum=delivered,enum=failed,enum=cancelled"`
	// Attempts made so far; ResponseStatus is the receiver's last answer
	// (0: none), LastError why the last attempt failed.
	Attempts       int    `json:"attempts"`
	ResponseStatus int    `json:"response_status"`
	LastError      string `json:"last_error,omitempty"`
	CreatedAt      string `json:"created_at" jsonschema:"format=date-time"`
	UpdatedAt      string `json:"updated_at" jsonschema:"format=date-time"`
}

// DeliveryView renders d.
func DeliveryView(d store.Delivery) Delivery {
	return Delivery{ID: d.ID, EventID: d.EventID, Status: d.Status, Attempts: d.Attempts, ResponseStatus: d.ResponseStatus,
		LastError: d.LastError, CreatedAt: FormatTime(d.CreatedAt), UpdatedAt: FormatTime(d.UpdatedAt)}
}

// DeliveriesQuery is the query of GET /api/webhooks/{id}/deliveries.
type DeliveriesQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=20"`
}

// ActingFor implements ActsFor.
func (q DeliveriesQuery) ActingFor() string { return q.AccountID }

// ParseDeliveriesQuery validates the query of GET
// /api/webhooks/{id}/deliveries (and of the webhook routes' account_id).
func ParseDeliveriesQuery(v url.Values) (DeliveriesQuery, error) {
	var q DeliveriesQuery
	var err error
	if q.AccountID, err = QueryAccountID(v); err != nil {
		return q, err
	}
	q.Limit, err = QueryLimit(v, 20)
	return q, err
}

// DeliveriesResponse answers GET /api/webhooks/{id}/deliveries.
type DeliveriesResponse struct {
	Status     string     `json:"status" jsonschema:"enum=success"`
	Deliveries []Delivery `json:"deliveries"`
}
