package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// handler is a control-plane route: it acts for caller c.
type handler func(w http.ResponseWriter, r *http.Request, c edge.Caller) error

func (a *API) controlPlane() http.Handler {
	r := chi.NewRouter()
	for _, prefix := range []string{"", "/v2"} {
		r.Post(prefix+"/sandboxes", a.route(a.create, true))
		r.Get(prefix+"/sandboxes", a.route(a.list, false))
		r.Post(prefix+"/sandboxes/{id}/connect", a.route(a.connect, true))
	}
	r.Get("/sandboxes/{id}", a.route(a.get, false))
	r.Delete("/sandboxes/{id}", a.route(a.kill, true))
	r.Post("/sandboxes/{id}/timeout", a.route(a.setTimeout, true))
	r.Post("/sandboxes/{id}/refreshes", a.route(a.refresh, true))
	r.Post("/sandboxes/{id}/pause", a.route(a.pause, true))
	r.Post("/sandboxes/{id}/resume", a.route(a.resume, true))
	r.Post("/sandboxes/{id}/fork", a.route(a.fork, true))
	r.Put("/sandboxes/{id}/network", a.route(a.setNetwork, true))
	r.Get("/sandboxes/{id}/metrics", a.route(a.metrics, false))
	r.Get("/sandboxes/{id}/logs", a.route(a.logs, false))
	r.Get("/v2/sandboxes/{id}/logs", a.route(a.logsV2, false))
	r.Post("/sandboxes/{id}/snapshots", a.route(a.createSnapshot, true))
	r.Get("/snapshots", a.route(a.listSnapshots, false))
	r.Get("/templates", a.route(a.templates, false))
	r.Delete("/templates/{templateID}", a.route(a.deleteTemplate, true))
	// Lifecycle events and webhooks (events.go).
	r.Get("/events/sandboxes", a.route(a.listEvents, false))
	r.Get("/events/sandboxes/{id}", a.route(a.sandboxEvents, false))
	r.Post("/events/webhooks", a.route(a.createWebhook, true))
	// A sandbox's own key may not read webhooks (writes true): their URLs
	// may carry their receivers' tokens.
	r.Get("/events/webhooks", a.route(a.listWebhooks, true))
	r.Get("/events/webhooks/{webhookID}", a.route(a.getWebhook, true))
	r.Patch("/events/webhooks/{webhookID}", a.route(a.updateWebhook, true))
	r.Delete("/events/webhooks/{webhookID}", a.route(a.deleteWebhook, true))
	// The Template API (templatebuild.go).
	r.Post("/v3/templates", a.route(a.requestTemplate, true))
	r.Post("/v2/templates/{templateID}/builds/{buildID}", a.route(a.startBuild, true))
	r.Get("/templates/{templateID}/builds/{buildID}/status", a.route(a.buildStatus, false))
	r.Get("/templates/aliases/{alias}", a.route(a.alias, false))
	r.Get("/templates/{templateID}/tags", a.route(a.tags, false))
	r.Get("/templates/{templateID}/files/{hash}", a.route(a.fileUploadLink, true))
	// The signed upload link's PUT (templatefiles.go): no API key, its
	// own bound.
	r.Put("/templates/{templateID}/files/{hash}", a.uploadFiles)
	r.Post("/templates/tags", a.route(a.assignTags, true))
	r.Delete("/templates/tags", a.route(a.removeTags, true))
	// Volumes (volumes.go); their content API is not served, and says so.
	r.Post("/volumes", a.route(a.createVolume, true))
	r.Get("/volumes", a.route(a.listVolumes, false))
	r.Get("/volumes/{volumeID}", a.route(a.getVolume, false))
	r.Delete("/volumes/{volumeID}", a.route(a.deleteVolume, true))
	r.HandleFunc("/volumecontent/*", a.volumeContent)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, r, edge.Errorf(http.StatusNotFound, "%s %s is not part of the E2B API sandboxd serves (see docs/E2B.md)", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, r, edge.Errorf(http.StatusMethodNotAllowed, "method %s not allowed on %s", r.Method, r.URL.Path))
	})
	return r
}

// route runs h for the caller (edge.Gate: a key in X-API-Key or a Bearer
// token, or the key another node of the cluster forwarded the request
// for), on the node that hosts the sandbox the path names. writes is set
// for routes that change something or start work, which a sandbox's own
// key may not use (edge.ScopeError, as every front end refuses it).
func (a *API) route(h handler, writes bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := a.gate.Authenticate(r, nil)
		if err == nil && writes && c.MayCall(http.MethodPost) != nil {
			err = edge.ScopeError(r.Method + " " + r.URL.Path)
		}
		if err != nil {
			a.fail(w, r, err)
			return
		}
		if id := chi.URLParam(r, "id"); id != "" && a.gate.ForwardIfElsewhere(w, r, c, envd.SandboxID(id)) {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := h(w, r, c); err != nil {
			a.fail(w, r, err)
		}
	}
}

// fail answers err in E2B's shape, as the edge explains it (edge.Explain:
// never an error's cause); an internal error is logged.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	e, internal := edge.Explain(err, "")
	if internal {
		a.log.ErrorContext(r.Context(), "e2b api", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	body := envd.Error{Code: e.Status, Message: e.Msg}
	var f *failedError
	if errors.As(err, &f) {
		body.FailureReason = f.reason
	}
	envd.WriteJSON(w, e.Status, body)
}

// writeJSON writes a control plane's answer.
func writeJSON(w http.ResponseWriter, code int, v any) { envd.WriteJSON(w, code, v) }

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	_, err := decodeRaw(r, v)
	return err
}

// decodeRaw is decode that also returns the body read.
func decodeRaw(r *http.Request, v any) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		// A body over maxBody is 413 (edge.Explain); one that broke off,
		// the caller's own doing.
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, edge.Errorf(http.StatusBadRequest, "the request body could not be read")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return b, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		// What is wrong with the caller's own JSON.
		return nil, edge.Errorf(http.StatusBadRequest, "request body: %v", err)
	}
	return b, nil
}

// sandboxOf returns live sandbox id with its E2B record when the caller may
// act for it (edge.Gate.Sandbox, the one access rule of every front end):
// a sandbox the caller may not see, one this API did not create and one
// that ended are all not found, as E2B answers for a killed sandbox. Not
// found, never a state of its own: the SDKs know only running and paused
// (a "failed" state fails their parsing), and read 404 as ended. One that
// failed says why in the 404 (failedError).
func (a *API) sandboxOf(ctx context.Context, c edge.Caller, id string) (store.Sandbox, store.E2BSandbox, error) {
	notFound := errdefs.Newf(errdefs.ErrNotFound, "sandbox %q not found", id)
	id = envd.SandboxID(id)
	sb, err := a.gate.Sandbox(ctx, c, id, "")
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	if err != nil {
		return store.Sandbox{}, store.E2BSandbox{}, err
	}
	e, err := a.opts.Store.GetE2BSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	if err != nil {
		return store.Sandbox{}, store.E2BSandbox{}, err
	}
	if sb = a.opts.Sandboxes.Live(ctx, []store.Sandbox{sb})[0]; !live(sb) {
		if sb.Status == store.SandboxFailed {
			return store.Sandbox{}, store.E2BSandbox{}, failed(sb)
		}
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	return sb, e, nil
}

// failedError is the 404 of a sandbox that failed: the SDKs raise their
// not-found error with its message, which says why, as failureReason does.
type failedError struct {
	e      *edge.Error
	reason string
}

func (f *failedError) Error() string { return f.e.Msg }
func (f *failedError) Unwrap() error { return f.e }

func failed(sb store.Sandbox) *failedError {
	reason := sb.FailureReason
	if reason == "" {
		reason = "no reason was recorded"
	}
	return &failedError{
		e:      edge.Errorf(http.StatusNotFound, "sandbox %q failed: %s", envd.E2BID(sb.ID), reason),
		reason: sb.FailureReason,
	}
}

// live reports whether a sandbox is still E2B's "running" or "paused".
func live(sb store.Sandbox) bool {
	return sb.Status == store.SandboxPending || sb.Status == store.SandboxRunning
}
