package e2b

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

func (a *API) kill(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.Stop(r.Context(), c.Principal, sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// timeoutRequest is E2B's {"timeout": seconds}.
type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

// duration is the request's timeout; a will bound it.
func (a *API) duration(t timeoutRequest) (time.Duration, error) {
	if t.Timeout == nil {
		return 0, edge.Errorf(http.StatusBadRequest, "timeout must be a positive number of seconds")
	}
	return a.seconds("timeout", *t.Timeout)
}

// maxSeconds is the most seconds a time.Duration holds: beyond it, n *
// time.Second wraps around (18446744074 s became 0.29 s, 9223372037 s a
// negative lifetime that meant the default).
const maxSeconds = math.MaxInt64 / int64(time.Second)

// seconds is field's value n, a number of seconds, as a duration: 400 when
// it is not positive or no duration can hold it. The manager bounds a
// lifetime by the server's maximum again (Options.MaxTimeout says it in
// seconds first).
func (a *API) seconds(field string, n int64) (time.Duration, error) {
	most := maxSeconds
	if a.opts.MaxTimeout > 0 {
		most = int64(a.opts.MaxTimeout / time.Second)
	}
	if n <= 0 || n > most {
		return 0, edge.Errorf(http.StatusBadRequest, "%s must be a positive number of seconds, at most %d", field, most)
	}
	return time.Duration(n) * time.Second, nil
}

func (a *API) setTimeout(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req timeoutRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	return a.extend(w, r, c, req)
}

// refresh is the older SDKs' keep-alive: {"duration": seconds} more.
func (a *API) refresh(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	return a.extend(w, r, c, timeoutRequest{Timeout: req.Duration})
}

// extend gives the sandbox of the request's path the lifetime req asks
// for, from now.
func (a *API) extend(w http.ResponseWriter, r *http.Request, c edge.Caller, req timeoutRequest) error {
	d, err := a.duration(req)
	if err != nil {
		return err
	}
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.SetTimeout(r.Context(), c.Principal, sb.ID, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) pause(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req struct {
		Memory *bool `json:"memory"` // the SDK's keepMemory
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if sb.Pause != "" {
		return edge.Errorf(http.StatusConflict, "sandbox %s is already paused", envd.E2BID(sb.ID))
	}
	pause := a.opts.Sandboxes.Pause
	if req.Memory != nil && !*req.Memory {
		// keepMemory: false: its files alone (the SDK: a resume
		// "cold-boots" it).
		pause = a.opts.Sandboxes.PauseFiles
	}
	if _, err := pause(r.Context(), c.Principal, sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume is v1's POST /sandboxes/{id}/resume: a running sandbox is a
// conflict.
func (a *API) resume(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	return a.connectOrResume(w, r, c, true)
}

// connect resumes a paused sandbox (201) or answers a running one (200),
// setting its timeout when the request gives one.
func (a *API) connect(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	return a.connectOrResume(w, r, c, false)
}

func (a *API) connectOrResume(w http.ResponseWriter, r *http.Request, c edge.Caller, onlyPaused bool) error {
	var req timeoutRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, e, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	code := http.StatusOK
	switch {
	case sb.Pause != "":
		code = http.StatusCreated
	case onlyPaused:
		return edge.Errorf(http.StatusConflict, "sandbox %s is already running", envd.E2BID(sb.ID))
	}
	if err := a.wake(r.Context(), c.Principal, sb, req); err != nil {
		return err
	}
	writeJSON(w, code, a.sandboxResponse(e))
	return nil
}

// wake resumes sb if it is paused and gives it the timeout req asks for:
// a resumed sandbox gets it whole, a running one only when it extends its
// life (E2B's connect never shortens a running sandbox's).
func (a *API) wake(ctx context.Context, p auth.Principal, sb store.Sandbox, req timeoutRequest) error {
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = a.duration(req); err != nil {
			return err
		}
	}
	running := sb.Pause == ""
	if !running {
		var err error
		if sb, err = a.opts.Sandboxes.Resume(ctx, p, sb.ID); err != nil {
			return err
		}
	}
	if d == 0 || (running && sb.Deadline.After(a.opts.Now().Add(d))) {
		return nil
	}
	_, err := a.opts.Sandboxes.SetTimeout(ctx, p, sb.ID, d)
	return err
}
