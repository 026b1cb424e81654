package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// E2B's Template API (the SDKs' Template.build, docs/design/e2b-template-wire.md)
// over package templates' Service.
//
// Identity: E2B makes a template's identity (POST /v3/templates) before
// its build starts (POST /v2/templates/{templateID}/builds/{buildID});
// a sandboxd template's row is made by its build, from an image. So the
// first call makes no row: it answers templateID = the template's NAME
// and buildID = its TAG, and the second builds NAME:TAG from those two
// path segments. Every later route takes templateID as the name (or a
// template's id, tpl_…) and buildID as the tag (or, the same, the id):
// one build per NAME:TAG, as the REST API has it (a rebuild is a delete
// and a build).

// maxLogEntries bounds the log entries of one status answer (E2B's limit).
const maxLogEntries = 100

// templateRequest is E2B's TemplateBuildRequestV3.
type templateRequest struct {
	Name     string   `json:"name"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

// templateRequestResponse is E2B's TemplateRequestResponseV3.
type templateRequestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Aliases    []string `json:"aliases"`
}

// requestTemplate is POST /v3/templates: it checks the name and answers
// the identity the build will have (templateID NAME, buildID TAG). One
// tag per build: a second is refused, not dropped.
func (a *API) requestTemplate(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	if _, err := a.canBuild(); err != nil {
		return err
	}
	var req templateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return edge.Errorf(http.StatusBadRequest, "name: required")
	}
	ref, err := templatespec.ParseRef(req.Name)
	if err != nil {
		return err
	}
	tags := []string{}
	if strings.Contains(req.Name, ":") {
		tags = append(tags, ref.Tag)
	}
	for _, t := range req.Tags {
		if t != "" && (len(tags) == 0 || tags[0] != t) {
			tags = append(tags, t)
		}
	}
	switch len(tags) {
	case 0:
		tags = []string{ref.Tag}
	case 1:
		if ref, err = templatespec.ParseRef(ref.Name + ":" + tags[0]); err != nil {
			return err
		}
	default:
		return edge.Errorf(http.StatusBadRequest, "tags: more than one tag per build is not supported yet (got %s)", strings.Join(tags, ", "))
	}
	name := ref.Name + ":" + ref.Tag
	writeJSON(w, http.StatusAccepted, templateRequestResponse{TemplateID: ref.Name, BuildID: ref.Tag, Names: []string{name}, Tags: tags, Aliases: []string{ref.Name}})
	return nil
}

// buildStart is E2B's TemplateBuildStartV2.
type buildStart struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             json.RawMessage `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID}: the
// build of NAME:TAG (templateID:buildID) through the templates service.
// fromTemplate builds over another template (its name[:tag] or id);
// fromImageRegistry's credentials go to the build (registryCredentials);
// COPY steps read the files uploaded under their filesHash
// (templatefiles.go).
func (a *API) startBuild(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	b, err := a.canBuild()
	if err != nil {
		return err
	}
	var req buildStart
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.FromTemplate != "" && req.FromImage != "":
		return edge.Errorf(http.StatusBadRequest, "fromImage and fromTemplate: give one base, not both")
	case req.FromImage == "" && req.FromTemplate == "":
		return edge.Errorf(http.StatusBadRequest, "fromImage or fromTemplate: required")
	}
	var kinds []struct {
		Type string `json:"type"`
	}
	if len(req.Steps) > 0 {
		if err := json.Unmarshal(req.Steps, &kinds); err != nil {
			return edge.Errorf(http.StatusBadRequest, "steps: %v", err)
		}
	}
	if len(kinds) == 0 {
		req.Steps = nil
	}
	if req.Force && req.Steps != nil {
		// The build's force (the SDK's skipCache() on the whole
		// template) is every step's: none is taken from the cache.
		forced, err := forceSteps(req.Steps)
		if err != nil {
			return err
		}
		req.Steps = forced
	}
	creds, err := registryCredentials(req.FromImageRegistry)
	if err != nil {
		return err
	}
	ref, err := templatespec.ParseRef(chi.URLParam(r, "templateID") + ":" + chi.URLParam(r, "buildID"))
	if err != nil {
		return err
	}
	if _, err := b.Build(r.Context(), c.Principal, templates.BuildRequest{Name: ref.Name + ":" + ref.Tag, Image: req.FromImage, FromTemplate: req.FromTemplate, Steps: req.Steps, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, Registry: creds}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// forceSteps marks every step of steps (E2B's wire form) "force": true,
// leaving the rest of each as sent.
func forceSteps(steps json.RawMessage) (json.RawMessage, error) {
	var all []map[string]json.RawMessage
	if err := json.Unmarshal(steps, &all); err != nil {
		return nil, edge.Errorf(http.StatusBadRequest, "steps: %v", err)
	}
	for _, st := range all {
		st["force"] = json.RawMessage("true")
	}
	out, err := json.Marshal(all)
	if err != nil {
		return nil, fmt.Errorf("encode the forced steps: %w", err)
	}
	return out, nil
}

// buildLogEntry is E2B's BuildLogEntry.
type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// buildStatusReason is E2B's BuildStatusReason.
type buildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

// buildInfo is E2B's TemplateBuildInfo.
type buildInfo struct {
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"`
	Logs       []string           `json:"logs"`
	LogEntries []buildLogEntry    `json:"logEntries"`
	Reason     *buildStatusReason `json:"reason,omitempty"`
}

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status: the
// template's status (building, ready, error) and its build log's lines
// from logsOffset on, at most limit (and maxLogEntries) of them; the
// offset counts lines. reason carries a failed build's failure reason
// (without a step: sandboxd's log does not number them).
func (a *API) buildStatus(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	t, err := a.ownTemplate(r, c, chi.URLParam(r, "templateID"), chi.URLParam(r, "buildID"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	offset, limit := 0, maxLogEntries
	if s := q.Get("logsOffset"); s != "" {
		if offset, err = strconv.Atoi(s); err != nil || offset < 0 {
			return edge.Errorf(http.StatusBadRequest, "logsOffset: not a count: %q", s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 0 {
			return edge.Errorf(http.StatusBadRequest, "limit: not a count: %q", s)
		}
		limit = min(limit, maxLogEntries)
	}
	entries := logEntries(t)
	entries = entries[min(offset, len(entries)):]
	entries = entries[:min(limit, len(entries))]
	out := buildInfo{TemplateID: t.Name, BuildID: t.Tag, Status: string(t.Status), Logs: []string{}, LogEntries: entries}
	for _, e := range entries {
		out.Logs = append(out.Logs, e.Timestamp.Format(time.RFC3339)+" "+e.Message)
	}
	if t.Status == store.TemplateFailed {
		out.Status = "error"
		reason := t.FailureReason
		if reason == "" {
			reason = "the build failed; no reason was recorded"
		}
		out.Reason = &buildStatusReason{Message: reason, LogEntries: []buildLogEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// logEntries splits t's build log into E2B's entries: one a line, its
// timestamp the line's own (templates' logLine) or else t's last change.
func logEntries(t store.Template) []buildLogEntry {
	out := []buildLogEntry{}
	for _, line := range strings.Split(t.Log, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		e := buildLogEntry{Timestamp: t.UpdatedAt.UTC(), Level: "info", Message: line}
		if ts, msg, ok := strings.Cut(line, " "); ok {
			if at, err := time.Parse(time.RFC3339, ts); err == nil {
				e.Timestamp, e.Message = at, msg
			}
		}
		out = append(out, e)
	}
	return out
}

// aliasResponse is E2B's TemplateAliasResponse.
type aliasResponse struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// alias is GET /templates/aliases/{alias}: 200 when the caller's account
// has a template of that name (any tag, or the exact NAME:TAG), else 404
// (another account's template is not found, so never E2B's 403).
func (a *API) alias(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	name := chi.URLParam(r, "alias")
	list, err := a.own(r, c)
	if err != nil {
		return err
	}
	ref, refErr := templatespec.ParseRef(name)
	for _, t := range list {
		if t.Name == name || (refErr == nil && strings.Contains(name, ":") && t.Name == ref.Name && t.Tag == ref.Tag) {
			writeJSON(w, http.StatusOK, aliasResponse{TemplateID: t.Name})
			return nil
		}
	}
	return errdefs.Newf(errdefs.ErrNotFound, "template %q not found", name)
}

// templateTag is an entry of E2B's GET /templates/{templateID}/tags.
type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// tags is GET /templates/{templateID}/tags: the tags of the caller's
// templates named templateID (or of the template with that id).
func (a *API) tags(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	id := chi.URLParam(r, "templateID")
	list, err := a.own(r, c)
	if err != nil {
		return err
	}
	name := id
	for _, t := range list {
		if t.ID == id {
			name = t.Name
		}
	}
	out := []templateTag{}
	for _, t := range list {
		if t.Name == name {
			out = append(out, templateTag{Tag: t.Tag, BuildID: t.Tag, CreatedAt: t.CreatedAt})
		}
	}
	if len(out) == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "template %q not found", id)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// notYet answers a Template API route sandboxd does not serve yet with
// E2B's 400, so that the SDK fails saying so.
func notYet(msg string) handler {
	return func(http.ResponseWriter, *http.Request, edge.Caller) error {
		return edge.Errorf(http.StatusBadRequest, "%s", msg)
	}
}

// canBuild returns the service that builds, or the refusal of a server
// without one.
func (a *API) canBuild() (CustomTemplates, error) {
	if a.opts.Custom == nil {
		return nil, edge.Errorf(http.StatusNotImplemented, "this server builds no templates")
	}
	return a.opts.Custom, nil
}

// own returns the caller's account's templates (never the public ones:
// the Template API changes and reads only the account's own).
func (a *API) own(r *http.Request, c edge.Caller) ([]store.Template, error) {
	if a.opts.Custom == nil {
		return nil, nil
	}
	list, err := a.opts.Custom.List(r.Context(), c.Principal)
	if err != nil {
		return nil, err
	}
	out := list[:0:0]
	for _, t := range list {
		if t.AccountID != "" && t.AccountID == c.Principal.AccountID {
			out = append(out, t)
		}
	}
	return out, nil
}

// ownTemplate is the caller's template NAME:TAG (templateID:buildID) or
// with id templateID; another account's is not found.
func (a *API) ownTemplate(r *http.Request, c edge.Caller, templateID, buildID string) (store.Template, error) {
	list, err := a.own(r, c)
	if err != nil {
		return store.Template{}, err
	}
	for _, t := range list {
		if (t.Name == templateID && t.Tag == buildID) || (t.ID == templateID && (buildID == t.ID || buildID == t.Tag)) {
			return t, nil
		}
	}
	return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "template %s build %s not found", templateID, buildID)
}
