package files

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Reservations hold, per account, the room of its repository's quota that
// its uploads in flight have taken for the files they spool, so that
// uploads at once cannot spool more together than the quota has room for.
// *store.Store keeps them in the database, shared by every node of a
// cluster; without one, a Service keeps them in its own memory (one
// node's uploads only).
type Reservations interface {
	// ReserveUpload grows (or makes) a reservation: see store.ReserveUpload.
	ReserveUpload(ctx context.Context, r store.UploadReservation) (store.UploadGrant, error)
	// RenewUpload keeps a reservation alive for ttl more.
	RenewUpload(ctx context.Context, id string, ttl time.Duration) error
	// ReleaseUpload deletes a reservation.
	ReleaseUpload(ctx context.Context, id string) error
}

// How reservations are taken and kept.
const (
	// reserveStep is what a reservation grows by beyond the bytes that
	// arrived, so that an upload asks for room every few MiB, not at every
	// write.
	reserveStep = 4 << 20
	// reservationTTL is how long a reservation outlives its last renewal:
	// the reservations of a node that died lapse after it.
	reservationTTL = 2 * time.Minute
	// renewEvery is how often an upload in flight renews its reservation,
	// well within reservationTTL.
	renewEvery = 30 * time.Second
	// releaseTimeout bounds the release at the end of an upload, which
	// runs whether or not the caller is still there.
	releaseTimeout = 10 * time.Second
)

// errRefused is a write refused because the whole upload is: the budget
// says why (refusal).
var errRefused = errors.New("upload refused")

// hold is one upload's reservation: what it holds, grown as files arrive
// and renewed until it is released.
type hold struct {
	res     Reservations
	log     *slog.Logger
	id      string
	account string
	limit   int64 // the room the account's uploads share
	max     int64 // the most this upload may take

	mu    sync.Mutex
	bytes int64
	err   error // set once a reservation was refused or failed

	stop chan struct{}
	done chan struct{}
}

// newHold starts the reservation of an upload of account, which takes no
// more than most bytes of limit, the room the account's uploads share. It
// holds room for the first bytes at once: an upload that finds no room
// left is refused before it spools anything.
func newHold(ctx context.Context, res Reservations, log *slog.Logger, account string, limit, most int64) (*hold, error) {
	h := &hold{
		res: res, log: log, id: store.NewID("upl_"), account: account, limit: limit, max: most,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	if err := h.cover(ctx, min(1, most)); err != nil {
		return nil, err // refused or failed: nothing was reserved
	}
	go h.renew(ctx)
	return h, nil
}

// cover makes the reservation hold at least total bytes, taking up to
// reserveStep more while there is room.
func (h *hold) cover(ctx context.Context, total int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if total <= h.bytes {
		return nil
	}
	if h.err != nil {
		return h.err
	}
	g, err := h.res.ReserveUpload(ctx, store.UploadReservation{
		ID: h.id, AccountID: h.account, Need: total, Want: max(total, min(total+reserveStep, h.max)),
		Limit: h.limit, TTL: reservationTTL,
	})
	if err != nil {
		h.err = err
		return err
	}
	h.bytes = g.Bytes
	return nil
}

// renew keeps the reservation alive until release.
func (h *hold) renew(ctx context.Context) {
	defer close(h.done)
	ctx = context.WithoutCancel(ctx)
	tick := time.NewTicker(renewEvery)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
			if err := h.res.RenewUpload(ctx, h.id, reservationTTL); err != nil {
				h.log.WarnContext(ctx, "upload: renew reservation", "account", h.account, "reservation", h.id, "err", err)
			}
		}
	}
}

// release gives the room back, on every path an upload ends by, whether
// or not its caller is still there.
func (h *hold) release(ctx context.Context) {
	close(h.stop)
	<-h.done
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := h.res.ReleaseUpload(ctx, h.id); err != nil {
		// It lapses after reservationTTL anyway.
		h.log.WarnContext(ctx, "upload: release reservation", "account", h.account, "reservation", h.id, "err", err)
	}
}

// localReservations keep reservations in this process's memory: the
// reservations of one node, for a Service without a database.
type localReservations struct {
	mu   sync.Mutex
	held map[string]localReservation
}

type localReservation struct {
	account string
	bytes   int64
	expires time.Time
}

func newLocalReservations() *localReservations {
	return &localReservations{held: map[string]localReservation{}}
}

// ReserveUpload implements Reservations as store.ReserveUpload does.
func (l *localReservations) ReserveUpload(_ context.Context, r store.UploadReservation) (store.UploadGrant, error) {
	if r.ID == "" || r.Need < 0 || r.Want < r.Need || r.TTL <= 0 {
		return store.UploadGrant{}, fmt.Errorf("reserve upload: %w: %+v", store.ErrInvalid, r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var g store.UploadGrant
	for id, h := range l.held {
		switch {
		case !h.expires.After(now):
			delete(l.held, id)
		case h.account == r.AccountID && id != r.ID:
			g.Others += h.bytes
			g.OtherCount++
		}
	}
	room := r.Limit - g.Others
	if room < r.Need {
		return g, fmt.Errorf("reserve upload %s: %w", r.ID, &store.UploadQuotaError{Need: r.Need, Others: g.Others, Limit: r.Limit, OtherCount: g.OtherCount})
	}
	g.Bytes = min(r.Want, room)
	l.held[r.ID] = localReservation{account: r.AccountID, bytes: g.Bytes, expires: now.Add(r.TTL)}
	return g, nil
}

// RenewUpload implements Reservations.
func (l *localReservations) RenewUpload(_ context.Context, id string, ttl time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	h, ok := l.held[id]
	if !ok || !h.expires.After(now) {
		return fmt.Errorf("renew upload reservation %s: %w", id, store.ErrNotFound)
	}
	h.expires = now.Add(ttl)
	l.held[id] = h
	return nil
}

// ReleaseUpload implements Reservations.
func (l *localReservations) ReleaseUpload(_ context.Context, id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, id)
	return nil
}
