package host

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Slot is a sandbox's session with its agent, which comes and goes: the
// backend sets it when the agent (re)connects, it empties itself when the
// session ends, and every operation waits in it for a session. The zero
// Slot is empty and ready for use.
type Slot struct {
	mu     sync.Mutex
	client *guest.Client
	hello  guest.Hello   // the last session's; kept after it ends
	ready  chan struct{} // closed while client != nil
}

// readyLocked is the channel closed while a session is set.
func (s *Slot) readyLocked() chan struct{} {
	if s.ready == nil {
		s.ready = make(chan struct{})
	}
	return s.ready
}

// Set makes c the session, closing the one it replaces; the slot empties
// itself when c ends.
func (s *Slot) Set(c *guest.Client) {
	s.mu.Lock()
	ready := s.readyLocked()
	old := s.client
	s.client, s.hello = c, c.Hello()
	if old == nil {
		close(ready)
	}
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go func() {
		<-c.Done()
		s.mu.Lock()
		if s.client == c {
			s.client = nil
			s.ready = make(chan struct{})
		}
		s.mu.Unlock()
	}()
}

// Client is the current session, or nil.
func (s *Slot) Client() *guest.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Hello is what the agent of the last session said of itself.
func (s *Slot) Hello() guest.Hello {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hello
}

// Close ends the current session, if any; the slot empties itself.
func (s *Slot) Close() {
	if c := s.Client(); c != nil {
		c.Close()
	}
}

// Wait returns the session, waiting for one while the sandbox may still
// get one: stopped (cheap, asked each time round) and dead (asked every
// poll while waiting) say it will not, and Wait then fails with
// runtime.ErrNotRunning.
func (s *Slot) Wait(ctx context.Context, poll time.Duration, stopped func() bool, dead func(context.Context) bool) (*guest.Client, error) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		if stopped() {
			return nil, runtime.ErrNotRunning
		}
		s.mu.Lock()
		c, ready := s.client, s.readyLocked()
		s.mu.Unlock()
		if c != nil {
			return c, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
			if dead(ctx) {
				return nil, runtime.ErrNotRunning
			}
		}
	}
}
