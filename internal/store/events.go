package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Lifecycle events (migration 00021): each change of a sandbox is recorded
// by the query that makes it, in the same transaction, so that an event
// exists exactly when its change does; and with it, a pending delivery for
// every enabled webhook of the account that takes its type (the outbox a
// dispatcher hands to River: internal/webhooks).

// The event types.
const (
	EventCreated     = "sandbox.created"
	EventRunning     = "sandbox.running"
	EventPaused      = "sandbox.paused"
	EventResumed     = "sandbox.resumed"
	EventUpdated     = "sandbox.updated"
	EventStopped     = "sandbox.stopped"
	EventFailed      = "sandbox.failed"
	EventSnapshot    = "sandbox.snapshot"
	EventRunFinished = "run.finished"
)

// EventTypes are the event types, in a sandbox's order of life.
var EventTypes = []string{EventCreated, EventRunning, EventPaused, EventResumed, EventUpdated, EventSnapshot, EventRunFinished, EventStopped, EventFailed}

// Event is one recorded change.
type Event struct {
	ID        string          `json:"id"` // evt_...
	AccountID string          `json:"account_id"`
	SandboxID string          `json:"sandbox_id"`
	Type      string          `json:"type"`
	Data      json.RawMessage `json:"data,omitempty"` // an object, or nil
	CreatedAt time.Time       `json:"created_at"`
}

// Cursor is where the event is in a list ordered by time and id.
func (e Event) Cursor() Cursor { return Cursor{CreatedAt: e.CreatedAt, ID: e.ID} }

const eventCols = "id, account_id, sandbox_id, type, data, created_at"

func scanEvent(s scanner) (Event, error) {
	var e Event
	var data string
	var created int64
	if err := s.Scan(&e.ID, &e.AccountID, &e.SandboxID, &e.Type, &data, &created); err != nil {
		return Event{}, err
	}
	if data != "" {
		e.Data = json.RawMessage(data)
	}
	e.CreatedAt = fromMillis(created)
	return e, nil
}

// eventData encodes an event's data ("" for none).
func eventData(data map[string]any) (string, error) {
	if len(data) == 0 {
		return "", nil
	}
	b, err := json.Marshal(data)
	if err != nil {
		return "", fmt.Errorf("encode event data: %w", err)
	}
	return string(b), nil
}

// sandboxEvent records event typ of sandbox id at at, with data, and the
// deliveries it makes. It must run in the transaction of the change it
// records (q.atomically). A sandbox that is gone records nothing.
func (q *Queries) sandboxEvent(ctx context.Context, id, typ string, data map[string]any, at time.Time) error {
	var account, reason string
	err := q.queryRow(ctx, "SELECT account_id, failure_reason FROM sandboxes WHERE id = ?", id).Scan(&account, &reason)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("record %s of sandbox %s: %w", typ, id, err)
	}
	if (typ == EventStopped || typ == EventFailed) && reason != "" {
		if data == nil {
			data = map[string]any{}
		}
		data["reason"] = reason
	}
	return q.insertEvent(ctx, Event{AccountID: account, SandboxID: id, Type: typ, CreatedAt: at}, data)
}

// insertEvent inserts e (a new id when it has none) with data, and a
// pending delivery for each enabled webhook of its account that takes its
// type: ids webhook:event, so that one event is delivered once to each.
func (q *Queries) insertEvent(ctx context.Context, e Event, data map[string]any) error {
	if e.ID == "" {
		e.ID = NewID("evt_")
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = nowMS()
	}
	d, err := eventData(data)
	if err != nil {
		return err
	}
	at := toMillis(ms(e.CreatedAt))
	if _, err := q.exec(ctx, "INSERT INTO events ("+eventCols+") VALUES (?, ?, ?, ?, ?, ?)", e.ID, e.AccountID, e.SandboxID, e.Type, d, at); err != nil {
		return fmt.Errorf("record event %s: %w", e.Type, mapErr(err))
	}
	if _, err := q.exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, event_id, account_id, status, created_at, updated_at)
		SELECT id || ':' || ?, id, ?, account_id, ?, ?, ? FROM webhooks
		WHERE account_id = ? AND enabled = ? AND (events = '' OR events LIKE ?)`,
		e.ID, e.ID, DeliveryPending, at, at, e.AccountID, true, "%,"+e.Type+",%"); err != nil {
		return fmt.Errorf("record the deliveries of event %s: %w", e.Type, mapErr(err))
	}
	return nil
}

// RecordEvent records an event of sandbox sandboxID that no state change
// of the store makes (a named snapshot taken), with its deliveries; a
// sandbox that is gone records nothing.
func (q *Queries) RecordEvent(ctx context.Context, sandboxID, typ string, data map[string]any) error {
	return q.atomically(ctx, func(q *Queries) error {
		return q.sandboxEvent(ctx, sandboxID, typ, data, nowMS())
	})
}

// EventFilter is what ListEvents answers.
type EventFilter struct {
	AccountID string
	SandboxID string   // "" for every sandbox of the account
	Types     []string // none for every type
	// After is the last event of the previous page (by time and id, in
	// the list's order); Offset skips that many first (E2B's paging).
	After  Cursor
	Offset int
	Limit  int
	Asc    bool // oldest first; newest first by default
	// Since and Until keep the events recorded at or after, at or
	// before them (zero: no bound).
	Since, Until time.Time
}

// ListEvents returns the account's events the filter asks for.
func (q *Queries) ListEvents(ctx context.Context, f EventFilter) ([]Event, error) {
	query := "SELECT " + eventCols + " FROM events WHERE account_id = ?"
	args := []any{f.AccountID}
	if f.SandboxID != "" {
		query += " AND sandbox_id = ?"
		args = append(args, f.SandboxID)
	}
	if len(f.Types) > 0 {
		in, inArgs := inList(f.Types)
		query += " AND type IN (" + in + ")"
		args = append(args, inArgs...)
	}
	if !f.Since.IsZero() {
		query += " AND created_at >= ?"
		args = append(args, toMillis(ms(f.Since)))
	}
	if !f.Until.IsZero() {
		query += " AND created_at <= ?"
		args = append(args, toMillis(ms(f.Until)))
	}
	order, cmp := "DESC", "<"
	if f.Asc {
		order, cmp = "ASC", ">"
	}
	if !f.After.IsZero() {
		t := toMillis(ms(f.After.CreatedAt))
		query += " AND (created_at " + cmp + " ? OR (created_at = ? AND id " + cmp + " ?))"
		args = append(args, t, t, f.After.ID)
	}
	query += " ORDER BY created_at " + order + ", id " + order + " LIMIT ? OFFSET ?"
	args = append(args, f.Limit, f.Offset)
	out, err := queryAll(ctx, q, scanEvent, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", f.AccountID, err)
	}
	return out, nil
}

// GetEvent returns event id.
func (q *Queries) GetEvent(ctx context.Context, id string) (Event, error) {
	e, err := scanEvent(q.queryRow(ctx, "SELECT "+eventCols+" FROM events WHERE id = ?", id))
	if err != nil {
		return Event{}, fmt.Errorf("get event %s: %w", id, notFound(err))
	}
	return e, nil
}

// DeleteEventsBefore deletes the events recorded before before and the
// deliveries of them that have ended (delivered, failed, cancelled), and
// reports how many events went. Deliveries still under way keep their
// event until they end.
func (q *Queries) DeleteEventsBefore(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := q.atomically(ctx, func(q *Queries) error {
		t := toMillis(ms(before))
		if _, err := q.exec(ctx, "DELETE FROM webhook_deliveries WHERE created_at < ? AND status IN (?, ?, ?)",
			t, DeliveryDelivered, DeliveryFailed, DeliveryCancelled); err != nil {
			return err
		}
		var err error
		n, err = q.execCount(ctx, "DELETE FROM events WHERE created_at < ? AND id NOT IN (SELECT event_id FROM webhook_deliveries)", t)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete events before %v: %w", before, err)
	}
	return n, nil
}

// Webhook is an account's URL that its events are POSTed to.
type Webhook struct {
	ID        string `json:"id"` // whk_...
	AccountID string `json:"account_id"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	// Secret is the signing secret, sealed (the webhooks service seals
	// and opens it); never answered.
	Secret string `json:"-"`
	// Events are the types it takes; none for all.
	Events    []string  `json:"events"`
	Format    string    `json:"format"` // WebhookFormatSandboxd or WebhookFormatE2B
	Enabled   bool      `json:"enabled"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// The webhook formats: sandboxd's payload and signature, or E2B's.
const (
	WebhookFormatSandboxd = "sandboxd"
	WebhookFormatE2B      = "e2b"
)

const webhookCols = "id, account_id, name, url, secret, events, format, enabled, created_at, updated_at"

func scanWebhook(s scanner) (Webhook, error) {
	var w Webhook
	var events string
	var created, updated int64
	if err := s.Scan(&w.ID, &w.AccountID, &w.Name, &w.URL, &w.Secret, &events, &w.Format, &w.Enabled, &created, &updated); err != nil {
		return Webhook{}, err
	}
	w.Events = []string{}
	for _, t := range strings.Split(strings.Trim(events, ","), ",") {
		if t != "" {
			w.Events = append(w.Events, t)
		}
	}
	w.CreatedAt, w.UpdatedAt = fromMillis(created), fromMillis(updated)
	return w, nil
}

// webhookEvents is the events column of types: ",a,b," ("" for all).
func webhookEvents(types []string) string {
	if len(types) == 0 {
		return ""
	}
	return "," + strings.Join(types, ",") + ","
}

// CreateWebhook inserts w, filling an empty ID ("whk_...") and the times.
func (q *Queries) CreateWebhook(ctx context.Context, w *Webhook) error {
	if w.ID == "" {
		w.ID = NewID("whk_")
	}
	if w.Format == "" {
		w.Format = WebhookFormatSandboxd
	}
	now := nowMS()
	w.CreatedAt, w.UpdatedAt = now, now
	if _, err := q.exec(ctx, "INSERT INTO webhooks ("+webhookCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		w.ID, w.AccountID, w.Name, w.URL, w.Secret, webhookEvents(w.Events), w.Format, w.Enabled, toMillis(now), toMillis(now)); err != nil {
		return fmt.Errorf("create webhook: %w", mapErr(err))
	}
	return nil
}

// GetWebhook returns webhook id.
func (q *Queries) GetWebhook(ctx context.Context, id string) (Webhook, error) {
	w, err := scanWebhook(q.queryRow(ctx, "SELECT "+webhookCols+" FROM webhooks WHERE id = ?", id))
	if err != nil {
		return Webhook{}, fmt.Errorf("get webhook %s: %w", id, notFound(err))
	}
	return w, nil
}

// ListWebhooks returns the account's webhooks, oldest first.
func (q *Queries) ListWebhooks(ctx context.Context, accountID string) ([]Webhook, error) {
	out, err := queryAll(ctx, q, scanWebhook, "SELECT "+webhookCols+" FROM webhooks WHERE account_id = ? ORDER BY created_at, id", accountID)
	if err != nil {
		return nil, fmt.Errorf("list webhooks of %s: %w", accountID, err)
	}
	return out, nil
}

// UpdateWebhook writes w's name, URL, secret, events and enabled.
func (q *Queries) UpdateWebhook(ctx context.Context, w *Webhook) error {
	w.UpdatedAt = nowMS()
	n, err := q.execCount(ctx, "UPDATE webhooks SET name = ?, url = ?, secret = ?, events = ?, enabled = ?, updated_at = ? WHERE id = ?",
		w.Name, w.URL, w.Secret, webhookEvents(w.Events), w.Enabled, toMillis(w.UpdatedAt), w.ID)
	if err != nil {
		return fmt.Errorf("update webhook %s: %w", w.ID, mapErr(err))
	}
	if n == 0 {
		return fmt.Errorf("update webhook %s: %w", w.ID, ErrNotFound)
	}
	return nil
}

// DeleteWebhook deletes webhook id and cancels its deliveries not yet
// made; ErrNotFound when there is none.
func (q *Queries) DeleteWebhook(ctx context.Context, id string) error {
	return q.atomically(ctx, func(q *Queries) error {
		n, err := q.execCount(ctx, "DELETE FROM webhooks WHERE id = ?", id)
		if err != nil {
			return fmt.Errorf("delete webhook %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("delete webhook %s: %w", id, ErrNotFound)
		}
		_, err = q.exec(ctx, "UPDATE webhook_deliveries SET status = ?, updated_at = ? WHERE webhook_id = ? AND status IN (?, ?)",
			DeliveryCancelled, toMillis(nowMS()), id, DeliveryPending, DeliveryQueued)
		return err
	})
}

// The states of a delivery.
const (
	DeliveryPending   = "pending"
	DeliveryQueued    = "queued"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
	DeliveryCancelled = "cancelled"
)

// Delivery is one event for one webhook, and how its attempts went.
type Delivery struct {
	ID             string    `json:"id"`
	WebhookID      string    `json:"webhook_id"`
	EventID        string    `json:"event_id"`
	AccountID      string    `json:"account_id"`
	Status         string    `json:"status"`
	Attempts       int       `json:"attempts"`
	ResponseStatus int       `json:"response_status"`
	LastError      string    `json:"last_error"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

const deliveryCols = "id, webhook_id, event_id, account_id, status, attempts, response_status, last_error, created_at, updated_at"

func scanDelivery(s scanner) (Delivery, error) {
	var d Delivery
	var created, updated int64
	if err := s.Scan(&d.ID, &d.WebhookID, &d.EventID, &d.AccountID, &d.Status, &d.Attempts, &d.ResponseStatus, &d.LastError, &created, &updated); err != nil {
		return Delivery{}, err
	}
	d.CreatedAt, d.UpdatedAt = fromMillis(created), fromMillis(updated)
	return d, nil
}

// ClaimPendingDeliveries moves up to limit pending deliveries, oldest
// first, to queued and returns their ids: one statement, so that two
// dispatchers never claim the same one. Run it in the transaction that
// enqueues their jobs.
func (q *Queries) ClaimPendingDeliveries(ctx context.Context, limit int) ([]string, error) {
	if q.tx == nil {
		return nil, fmt.Errorf("claim pending deliveries: %w: outside a transaction", ErrInvalid)
	}
	rows, err := q.query(ctx, `UPDATE webhook_deliveries SET status = ?, updated_at = ?
		WHERE status = ? AND id IN (SELECT id FROM webhook_deliveries WHERE status = ? ORDER BY created_at, id LIMIT ?)
		RETURNING id`, DeliveryQueued, toMillis(nowMS()), DeliveryPending, DeliveryPending, limit)
	if err != nil {
		return nil, fmt.Errorf("claim pending deliveries: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// GetDelivery returns delivery id.
func (q *Queries) GetDelivery(ctx context.Context, id string) (Delivery, error) {
	d, err := scanDelivery(q.queryRow(ctx, "SELECT "+deliveryCols+" FROM webhook_deliveries WHERE id = ?", id))
	if err != nil {
		return Delivery{}, fmt.Errorf("get delivery %s: %w", id, notFound(err))
	}
	return d, nil
}

// RecordDeliveryAttempt records an attempt of queued delivery id: its
// state after it (queued while attempts are left), how many attempts were
// made, the answer's status (0 for none) and the error (""). It reports
// false when the delivery is no longer queued (cancelled meanwhile).
func (q *Queries) RecordDeliveryAttempt(ctx context.Context, id, status string, attempts, responseStatus int, lastError string) (bool, error) {
	n, err := q.execCount(ctx, `UPDATE webhook_deliveries SET status = ?, attempts = ?, response_status = ?, last_error = ?, updated_at = ?
		WHERE id = ? AND status = ?`, status, attempts, responseStatus, lastError, toMillis(nowMS()), id, DeliveryQueued)
	if err != nil {
		return false, fmt.Errorf("record an attempt of delivery %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// ListDeliveries returns webhook id's deliveries, newest first, at most
// limit.
func (q *Queries) ListDeliveries(ctx context.Context, webhookID string, limit int) ([]Delivery, error) {
	out, err := queryAll(ctx, q, scanDelivery, "SELECT "+deliveryCols+" FROM webhook_deliveries WHERE webhook_id = ? ORDER BY created_at DESC, id DESC LIMIT ?", webhookID, limit)
	if err != nil {
		return nil, fmt.Errorf("list deliveries of %s: %w", webhookID, err)
	}
	return out, nil
}
