package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
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
// Identity: E2B makes a build (POST /v3/templates) before its definition
// comes (POST /v2/templates/{templateID}/builds/{buildID}). Here the first
// call records the build waiting (templates' Request: a template row with
// no source yet) and answers templateID = the template's NAME and buildID
// = the row's id (tpl_…); the second starts it (Start). A build takes its
// tags when ready; one whose tag another build holds waits untagged until
// then (package templates' tags.go), so buildID, not the tag, names a
// build. The status route also takes the tag as buildID (NAME:TAG) and the
// id as both.

// maxLogEntries bounds the log entries of one status answer (E2B's limit).
const maxLogEntries = 100

// templateRequest is E2B's TemplateBuildRequestV3.
type templateRequest struct {
	Name          string   `json:"name"`
	Tags          []string `json:"tags"`
	CPUCount      float64  `json:"cpuCount"`
	MemoryMB      int64    `json:"memoryMB"`
	MinFreeDiskMB int64    `json:"minFreeDiskMb"`
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

// requestTemplate is POST /v3/templates: it records the build waiting for
// its definition and answers its identity. The tag in name comes first;
// without one, the first of tags, else latest. cpuCount and memoryMB size
// the build sandboxes (400 over the server's limits); minFreeDiskMb is
// taken when a sandbox's disk is at least that large.
func (a *API) requestTemplate(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	b, err := a.canBuild()
	if err != nil {
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
	var tags []string
	if strings.Contains(req.Name, ":") {
		tags = append(tags, ref.Tag)
	}
	for _, t := range req.Tags {
		if t != "" && !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		tags = []string{ref.Tag}
	}
	if req.MinFreeDiskMB < 0 || (a.opts.DiskMB > 0 && req.MinFreeDiskMB > int64(a.opts.DiskMB)) {
		return edge.Errorf(http.StatusBadRequest, "minFreeDiskMb: %d; a sandbox's disk on this server is %d MiB", req.MinFreeDiskMB, a.opts.DiskMB)
	}
	t, err := b.Request(r.Context(), c.Principal, templates.RequestSpec{Name: ref.Name + ":" + tags[0], Tags: tags[1:], CPUs: req.CPUCount, MemoryMiB: req.MemoryMB})
	if err != nil {
		return err
	}
	names := make([]string, len(tags))
	for i, tag := range tags {
		names[i] = t.Name + ":" + tag
	}
	writeJSON(w, http.StatusAccepted, templateRequestResponse{TemplateID: t.Name, BuildID: t.ID, Names: names, Tags: tags, Aliases: []string{t.Name}})
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
// start of the requested build buildID of template templateID (or, for a
// buildID that names no requested build, the build of NAME:TAG at once)
// through the templates service. fromTemplate builds over another
// template (its name[:tag] or id);
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
	build := templates.BuildRequest{Image: req.FromImage, FromTemplate: req.FromTemplate, Steps: req.Steps, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, Registry: creds}
	templateID, buildID := pathParam(r, "templateID"), pathParam(r, "buildID")
	t, err := b.Get(r.Context(), c.Principal, buildID)
	switch {
	case err == nil:
		if t.AccountID != c.Principal.AccountID || (t.Name != templateID && t.ID != templateID) {
			return errdefs.Newf(errdefs.ErrNotFound, "template %s build %s not found", templateID, buildID)
		}
		_, err = b.Start(r.Context(), c.Principal, t.ID, build)
	case errors.Is(err, errdefs.ErrNotFound) && !strings.HasPrefix(buildID, "tpl_"):
		// buildID as a tag: the build requested as NAME:TAG, waiting in
		// its place, or else NAME:TAG built at once, as the REST API
		// does (409 when it exists).
		ref, rerr := templatespec.ParseRef(templateID + ":" + buildID)
		if rerr != nil {
			return err
		}
		if w, ok := a.waitingAs(r, c, ref.Name, ref.Tag); ok {
			_, err = b.Start(r.Context(), c.Principal, w.ID, build)
			break
		}
		build.Name = ref.Name + ":" + ref.Tag
		_, err = b.Build(r.Context(), c.Principal, build)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// waitingAs is the caller's requested build that holds NAME:TAG and waits
// for its start, if any.
func (a *API) waitingAs(r *http.Request, c edge.Caller, name, tag string) (store.Template, bool) {
	list, err := a.own(r, c)
	if err != nil {
		return store.Template{}, false
	}
	for _, t := range list {
		if t.Name == name && t.Tag == tag && t.Waiting() {
			return t, true
		}
	}
	return store.Template{}, false
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
// build's status (waiting, building, ready, error) and its build log's
// lines from logsOffset on, at most limit (and maxLogEntries) of them; the
// offset counts lines. Each entry names its step ("base", the step's
// number, "finalize"; see logEntries); reason carries a failed build's
// failure reason and its step.
func (a *API) buildStatus(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	t, err := a.ownTemplate(r, c, pathParam(r, "templateID"), pathParam(r, "buildID"))
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
	all, last := logEntries(t)
	entries := all[min(offset, len(all)):]
	entries = entries[:min(limit, len(entries))]
	out := buildInfo{TemplateID: t.Name, BuildID: t.Build(), Status: string(t.Status), Logs: []string{}, LogEntries: entries}
	for _, e := range entries {
		out.Logs = append(out.Logs, e.Timestamp.Format(time.RFC3339)+" "+e.Message)
	}
	switch {
	case t.Waiting():
		out.Status = "waiting"
	case t.Status == store.TemplateFailed:
		out.Status = "error"
		reason := t.FailureReason
		if reason == "" {
			reason = "the build failed; no reason was recorded"
		}
		out.Reason = &buildStatusReason{Message: reason, Step: failedStep(reason, last), LogEntries: []buildLogEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// The lines of package templates' build log that start a step: "step N/M:
// …" (N from 1, as E2B numbers steps[]) and "finalize: …" (the start and
// ready commands); the lines before the first are the base's (the image's
// fetch), those after a start line that step's (its output).
var (
	stepLine   = regexp.MustCompile(`^step (\d+)/\d+: `)
	failedLine = regexp.MustCompile(`^step (\d+) `)
)

// logEntries splits t's build log into E2B's entries: one a line, its
// timestamp the line's own (templates' logLine) or else t's last change,
// its step the step whose lines it is among; last is the step of the last
// line. A log whose start was cut (its first line is not the build's
// first) gives no step to the lines before the first step line.
func logEntries(t store.Template) (out []buildLogEntry, last string) {
	out = []buildLogEntry{}
	step, first := "", true
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
		if first && strings.HasPrefix(e.Message, "build of ") {
			step = "base"
		}
		first = false
		switch m := stepLine.FindStringSubmatch(e.Message); {
		case m != nil:
			step = m[1]
		case strings.HasPrefix(e.Message, "finalize: "):
			step = "finalize"
		case strings.HasPrefix(e.Message, "build failed: "):
			e.Level = "error"
		}
		e.Step = step
		out = append(out, e)
	}
	return out, step
}

// failedStep is the step a failure reason names ("step N (…" or
// "finalize: …"), else last, the step the log had reached.
func failedStep(reason, last string) string {
	if m := failedLine.FindStringSubmatch(reason); m != nil {
		return m[1]
	}
	if strings.HasPrefix(reason, "finalize: ") {
		return "finalize"
	}
	return last
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
	name := pathParam(r, "alias")
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
// templates named templateID (or "name:tag", or the name of the template
// with that id).
func (a *API) tags(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	id := pathParam(r, "templateID")
	list, err := a.own(r, c)
	if err != nil {
		return err
	}
	name, _, _ := strings.Cut(id, ":") // "name:tag" names its template too
	for _, t := range list {
		if t.ID == id {
			name = t.Name
		}
	}
	out := []templateTag{}
	for _, t := range list {
		if t.Name == name {
			out = append(out, templateTag{Tag: t.Tag, BuildID: t.Build(), CreatedAt: t.CreatedAt})
		}
	}
	if len(out) == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "template %q not found", id)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// assignTagsRequest is E2B's AssignTemplateTagsRequest.
type assignTagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// assignTagsResponse is E2B's AssignedTemplateTags.
type assignTagsResponse struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// assignTags is POST /templates/tags: the build the caller's target
// (NAME:TAG) starts takes the tags too, each moved from the build that
// held it (whose sandboxes run on).
func (a *API) assignTags(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	b, err := a.canBuild()
	if err != nil {
		return err
	}
	var req assignTagsRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Target == "" {
		return edge.Errorf(http.StatusBadRequest, "target: required")
	}
	t, err := b.AssignTags(r.Context(), c.Principal, req.Target, req.Tags)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, assignTagsResponse{BuildID: t.Build(), Tags: req.Tags})
	return nil
}

// removeTagsRequest is E2B's DeleteTemplateTagsRequest.
type removeTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// removeTags is DELETE /templates/tags: the caller's NAME:TAG of each tag
// stops naming a build (the builds stay for their sandboxes). A tag the
// name does not have is 404.
func (a *API) removeTags(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	b, err := a.canBuild()
	if err != nil {
		return err
	}
	var req removeTagsRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	name, _, _ := strings.Cut(req.Name, ":")
	if name == "" {
		return edge.Errorf(http.StatusBadRequest, "name: required")
	}
	if err := b.RemoveTags(r.Context(), c.Principal, name, req.Tags); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
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

// ownTemplate is the caller's build buildID (a template's id: a build
// waiting for its tag too) of template templateID (its name, or the id
// again), or else the caller's template NAME:TAG (templateID:buildID);
// another account's is not found.
func (a *API) ownTemplate(r *http.Request, c edge.Caller, templateID, buildID string) (store.Template, error) {
	notFound := errdefs.Newf(errdefs.ErrNotFound, "template %s build %s not found", templateID, buildID)
	if a.opts.Custom == nil {
		return store.Template{}, notFound
	}
	t, err := a.opts.Custom.Get(r.Context(), c.Principal, buildID)
	switch {
	case err == nil:
		if t.AccountID == "" || t.AccountID != c.Principal.AccountID || (t.Name != templateID && t.ID != templateID) {
			return store.Template{}, notFound
		}
		return t, nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return store.Template{}, err
	}
	list, err := a.own(r, c)
	if err != nil {
		return store.Template{}, err
	}
	for _, t := range list {
		if t.Name == templateID && t.Tag == buildID {
			return t, nil
		}
	}
	return store.Template{}, notFound
}

// pathParam is the path parameter name, unescaped: the SDKs escape a
// "name:tag" in a path (%3A).
func pathParam(r *http.Request, name string) string {
	return edge.Unescaped(chi.URLParam(r, name))
}
