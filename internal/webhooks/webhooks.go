// Package webhooks serves an account's lifecycle events (recorded by the
// store with the changes they describe) and delivers them to the webhooks
// it registers: POSTs signed with the webhook's secret, retried with
// backoff through River, each delivery's attempts kept to be seen.
//
// The store inserts a pending delivery with each event (an outbox, in the
// event's transaction); every node's dispatcher claims pending deliveries
// and enqueues a River job for each in the same transaction (Run); the
// job's worker makes an attempt and records it, and River retries a failed
// one until jobs.DeliveryAttempts are spent (Worker). A webhook's URL is
// checked when it is registered and again at each connection (fetch's
// address guard): private, loopback and metadata addresses are refused
// unless the operator allows private ones.
package webhooks

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/sealbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Bounds of what an account registers.
const (
	MaxWebhooks     = 20
	maxURLBytes     = 2048
	maxNameBytes    = 256
	minSecretBytes  = 16
	maxSecretBytes  = 512
	maxDeliveryList = 100
)

// Config configures a Service.
type Config struct {
	Store *store.Store
	// Jobs enqueues the deliveries (nil: events are recorded and listed,
	// and nothing is delivered: Run refuses to start).
	Jobs *jobs.Client
	// Key seals the webhooks' signing secrets (sealbox.KeyBytes; the
	// server's key, from which a key of its own is derived).
	Key []byte
	// AllowPrivate lets webhooks reach private and loopback addresses
	// (never metadata services).
	AllowPrivate bool
	// RetryBase is the wait before the second attempt; each later one
	// waits twice the one before, at most an hour (default 10s).
	RetryBase time.Duration
	// Timeout bounds one attempt (default 10s).
	Timeout time.Duration
	// KeepEvents is how long events are kept (0: forever).
	KeepEvents time.Duration
	// Resolver resolves webhooks' host names (nil: the system's).
	Resolver fetch.Resolver
	Logger   *slog.Logger
	Now      func() time.Time
}

// Service keeps an account's webhooks and delivers its events.
type Service struct {
	cfg Config
	st  *store.Store
	box *sealbox.Box
	log *slog.Logger
	// client makes the deliveries: through the address guard, without
	// keeping connections or following redirects (send).
	client *http.Client
}

// New makes the service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("webhooks: a store is required")
	}
	if len(cfg.Key) != sealbox.KeyBytes {
		return nil, fmt.Errorf("webhooks: the key has %d bytes, want %d", len(cfg.Key), sealbox.KeyBytes)
	}
	box, err := sealbox.New(sealbox.Derive(cfg.Key, "sandboxd webhooks: signing secrets key v1"))
	if err != nil {
		return nil, err
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{cfg: cfg, st: cfg.Store, box: box, log: cfg.Logger}
	s.client = &http.Client{
		Timeout:   cfg.Timeout,
		Transport: &http.Transport{DialContext: s.dialer().DialContext, DisableKeepAlives: true, ResponseHeaderTimeout: cfg.Timeout},
		// A redirect is not followed: the receiver is the URL registered.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s, nil
}

// Spec is a webhook as registered or changed. A nil field of a change
// leaves the webhook's as it is.
type Spec struct {
	Name *string
	URL  *string
	// Events are the types the webhook takes (store.EventTypes); empty
	// for all.
	Events *[]string
	// Secret signs the deliveries; empty at registration: one is made.
	Secret  *string
	Enabled *bool
	// Format is store.WebhookFormatSandboxd (default) or
	// store.WebhookFormatE2B; set at registration only.
	Format string
}

// Create registers webhook spec for account accountID and answers it and
// its secret (the one given, or the one made), which is never answered
// again.
func (s *Service) Create(ctx context.Context, accountID string, spec Spec) (store.Webhook, string, error) {
	w := store.Webhook{AccountID: accountID, Enabled: true, Format: cmp.Or(spec.Format, store.WebhookFormatSandboxd)}
	if w.Format != store.WebhookFormatSandboxd && w.Format != store.WebhookFormatE2B {
		return w, "", errdefs.Newf(errdefs.ErrInvalid, "format %q: want sandboxd or e2b", w.Format)
	}
	if spec.URL == nil {
		return w, "", errdefs.New(errdefs.ErrInvalid, "url: required")
	}
	secret := ""
	if spec.Secret == nil || *spec.Secret == "" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return w, "", err
		}
		secret = "whsec_" + hex.EncodeToString(b)
		spec.Secret = &secret
	}
	existing, err := s.st.ListWebhooks(ctx, accountID)
	if err != nil {
		return w, "", err
	}
	if len(existing) >= MaxWebhooks {
		return w, "", errdefs.Newf(errdefs.ErrConflict, "the account has %d webhooks, the most it may have; delete one first", MaxWebhooks)
	}
	w.ID = store.NewID("whk_")
	if err := s.apply(ctx, &w, spec); err != nil {
		return w, "", err
	}
	if err := s.st.CreateWebhook(ctx, &w); err != nil {
		return w, "", err
	}
	s.log.Info("webhook registered", "webhook_id", w.ID, "account_id", accountID, "format", w.Format)
	return w, *spec.Secret, nil
}

// apply checks spec's fields and sets them on w (its secret sealed).
func (s *Service) apply(ctx context.Context, w *store.Webhook, spec Spec) error {
	if spec.Name != nil {
		if len(*spec.Name) > maxNameBytes || !utf8.ValidString(*spec.Name) {
			return errdefs.Newf(errdefs.ErrInvalid, "name: at most %d bytes of UTF-8", maxNameBytes)
		}
		w.Name = *spec.Name
	}
	if spec.URL != nil {
		if err := s.checkURL(ctx, *spec.URL); err != nil {
			return err
		}
		w.URL = *spec.URL
	}
	if spec.Events != nil {
		events, err := checkEvents(*spec.Events, w.Format)
		if err != nil {
			return err
		}
		w.Events = events
	}
	if w.Format == store.WebhookFormatE2B && len(w.Events) == 0 {
		// E2B's payload has no form for the others (running, a run's end).
		w.Events = e2bTypes()
	}
	if spec.Secret != nil && *spec.Secret != "" {
		if n := len(*spec.Secret); n < minSecretBytes || n > maxSecretBytes {
			return errdefs.Newf(errdefs.ErrInvalid, "secret: %d to %d bytes", minSecretBytes, maxSecretBytes)
		}
		sealed, err := s.box.Seal(w.ID, []byte(*spec.Secret))
		if err != nil {
			return err
		}
		w.Secret = sealed
	}
	if spec.Enabled != nil {
		w.Enabled = *spec.Enabled
	}
	return nil
}

// checkURL refuses a URL a webhook cannot have: not http(s), with
// credentials or a fragment, too long, or an address the guard refuses
// (checked for an address given as such; a host name is checked at each
// connection, where its answer is used).
func (s *Service) checkURL(ctx context.Context, raw string) error {
	bad := func(why string) error { return errdefs.Newf(errdefs.ErrInvalid, "url: %s", why) }
	if len(raw) > maxURLBytes {
		return bad(fmt.Sprintf("at most %d bytes", maxURLBytes))
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return bad("not a URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return bad("want an http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return bad("no host")
	case u.User != nil:
		return bad("credentials in the URL are not taken; authenticate with the signature")
	case u.Fragment != "":
		return bad("a fragment is never sent")
	}
	d := s.dialer()
	if err := d.CheckHost(u.Hostname()); err != nil {
		return errdefs.Wrap(errdefs.ErrInvalid, err, "url: "+fetch.Reason(err))
	}
	// A name is checked now too, for a clear answer (a name that does not
	// resolve now may later: it is taken); each connection checks again.
	if _, err := netip.ParseAddr(u.Hostname()); err != nil {
		var res fetch.Resolver = net.DefaultResolver
		if s.cfg.Resolver != nil {
			res = s.cfg.Resolver
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		ips, _ := res.LookupNetIP(lctx, "ip", u.Hostname())
		for _, ip := range ips {
			if err := d.Policy.Check(ip); err != nil {
				return errdefs.Wrap(errdefs.ErrInvalid, err, "url: "+u.Hostname()+" resolves to "+ip.String()+": "+fetch.Reason(err))
			}
		}
	}
	return nil
}

// dialer is the address guard deliveries connect through.
func (s *Service) dialer() *fetch.Dialer {
	return &fetch.Dialer{Policy: fetch.Policy{AllowPrivate: s.cfg.AllowPrivate}, Resolver: s.cfg.Resolver, Timeout: s.cfg.Timeout}
}

// checkEvents validates a webhook's event types, de-duplicated in the
// store's order. An E2B webhook names E2B's types, which are mapped to
// sandboxd's.
func checkEvents(in []string, format string) ([]string, error) {
	var out []string
	for _, t := range in {
		var mapped []string
		if format == store.WebhookFormatE2B {
			mapped = fromE2BType(t)
		} else if slices.Contains(store.EventTypes, t) {
			mapped = []string{t}
		}
		if mapped == nil {
			want := store.EventTypes
			if format == store.WebhookFormatE2B {
				want = e2bTypeNames()
			}
			return nil, errdefs.Newf(errdefs.ErrInvalid, "events: %q is not an event type (%s)", t, strings.Join(want, ", "))
		}
		out = append(out, mapped...)
	}
	var ordered []string
	for _, t := range store.EventTypes {
		if slices.Contains(out, t) {
			ordered = append(ordered, t)
		}
	}
	return ordered, nil
}

// List is the account's webhooks, oldest first.
func (s *Service) List(ctx context.Context, accountID string) ([]store.Webhook, error) {
	return s.st.ListWebhooks(ctx, accountID)
}

// Get is webhook id of the account; another's, or none, is not found.
func (s *Service) Get(ctx context.Context, accountID, id string) (store.Webhook, error) {
	w, err := s.st.GetWebhook(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.AccountID != accountID) {
		return store.Webhook{}, errdefs.Newf(errdefs.ErrNotFound, "webhook %q not found", id)
	}
	return w, err
}

// Update changes webhook id of the account by spec (its format stays).
func (s *Service) Update(ctx context.Context, accountID, id string, spec Spec) (store.Webhook, error) {
	w, err := s.Get(ctx, accountID, id)
	if err != nil {
		return w, err
	}
	if spec.Format != "" && spec.Format != w.Format {
		return w, errdefs.New(errdefs.ErrInvalid, "format: set at registration; register another webhook")
	}
	if err := s.apply(ctx, &w, spec); err != nil {
		return w, err
	}
	if err := s.st.UpdateWebhook(ctx, &w); err != nil {
		return w, err
	}
	return w, nil
}

// Delete deletes webhook id of the account; its deliveries not yet made
// are cancelled.
func (s *Service) Delete(ctx context.Context, accountID, id string) (store.Webhook, error) {
	w, err := s.Get(ctx, accountID, id)
	if err != nil {
		return w, err
	}
	if err := s.st.DeleteWebhook(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return w, errdefs.Newf(errdefs.ErrNotFound, "webhook %q not found", id)
		}
		return w, err
	}
	return w, nil
}

// Deliveries are webhook id's deliveries, newest first, at most limit
// (1 to 100).
func (s *Service) Deliveries(ctx context.Context, accountID, id string, limit int) ([]store.Delivery, error) {
	if _, err := s.Get(ctx, accountID, id); err != nil {
		return nil, err
	}
	return s.st.ListDeliveries(ctx, id, min(max(limit, 1), maxDeliveryList))
}

// Events lists the account's events (store.ListEvents).
func (s *Service) Events(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	for _, t := range f.Types {
		if !slices.Contains(store.EventTypes, t) {
			return nil, errdefs.Newf(errdefs.ErrInvalid, "type %q is not an event type (%s)", t, strings.Join(store.EventTypes, ", "))
		}
	}
	return s.st.ListEvents(ctx, f)
}
