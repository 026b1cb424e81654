package mcpserver

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TemplateService builds and keeps the accounts' templates, as the REST
// API's /api/templates routes use it (internal/templates). Every method
// applies the one access rule to the principal it is given.
type TemplateService interface {
	Build(ctx context.Context, p auth.Principal, req templates.BuildRequest) (store.Template, error)
	List(ctx context.Context, p auth.Principal) ([]store.Template, error)
	Get(ctx context.Context, p auth.Principal, id string) (store.Template, error)
	Delete(ctx context.Context, p auth.Principal, id string) error
	// The named snapshots are templates of kind snapshot (snapshots.go).
	SnapshotService
}

// The template tools' arguments. build_template's are POST /api/templates'
// body (the same names, checked by contract.ParseBuildTemplate), plus
// wait. Templates are the key's own account's, as in the API: no
// account_id.

type buildTemplateArgs struct {
	Name         string         `json:"name" jsonschema:"name[:tag] of the template: a name of 1 to 63 lower-case letters, digits, '-', '_' and '.' (starting and ending with a letter or digit) and a tag (default latest); one per name and tag in an account"`
	Image        string         `json:"image,omitempty" jsonschema:"The OCI image to build from: host/repository[:tag|@digest], a public image (pinned by digest once resolved). Required unless dockerfile is given"`
	Steps        []templateStep `json:"steps,omitempty" jsonschema:"Steps run over the image in build sandboxes, in order (not with dockerfile)"`
	Dockerfile   string         `json:"dockerfile,omitempty" jsonschema:"A Dockerfile's text instead of image and steps: one FROM (the image), RUN, ENV, ARG, WORKDIR, USER; CMD and ENTRYPOINT are recorded, not run"`
	FromTemplate string         `json:"fromTemplate,omitempty" jsonschema:"Another template to build over instead of an image: its id (tpl_...) or name[:tag], the account's own before a public one; its files, config and start and ready commands, which steps, startCmd and readyCmd extend or override"`
	StartCmd     string         `json:"startCmd,omitempty" jsonschema:"Run by /bin/sh in every sandbox from the template when it starts, and kept running (a server, say)"`
	ReadyCmd     string         `json:"readyCmd,omitempty" jsonschema:"Run by /bin/sh every 200 ms until it exits 0: a sandbox from the template is running from then on"`
	Wait         *bool          `json:"wait,omitempty" jsonschema:"Wait for the build to end, with progress notifications (default false: answers at once, the template building; follow it with get_template)"`
}

// templateStep is one step, in E2B's TemplateStep form (contract.TemplateStep).
type templateStep struct {
	Type  string   `json:"type" jsonschema:"RUN [command] or [command, user]; ENV and ARG [name, value, ...]; WORKDIR [path]; USER [user]"`
	Args  []string `json:"args" jsonschema:"The step's arguments, by type"`
	Force bool     `json:"force,omitempty" jsonschema:"Rebuild this step and every later one whatever the build cache holds"`
}

type listTemplatesArgs struct {
	Status string `json:"status,omitempty" jsonschema:"Only the templates in this state: building, ready or failed (default: all)"`
}

type templateArgs struct {
	Template string `json:"template" jsonschema:"The template: its id (tpl_...) or name[:tag], the account's own before a public one"`
}

type getTemplateArgs struct {
	Template string `json:"template" jsonschema:"The template: its id (tpl_...) or name[:tag], the account's own before a public one"`
	LogLines int    `json:"log_lines,omitempty" jsonschema:"How many of the build log's last lines to answer (1 to 2000, default 50)"`
}

const (
	defaultLogLines = 50
	maxLogLines     = 2000
)

// templateStepKinds are the step types a build runs.
var templateStepKinds = []any{"RUN", "ENV", "ARG", "WORKDIR", "USER"}

func (h *Handler) templateTools() []tool {
	return []tool{
		{name: "build_template", title: "Build a template", changes: true, in: reflect.TypeFor[buildTemplateArgs](), fn: h.buildTemplate,
			description: "Build a template of the account (as POST /api/templates): a root filesystem sandboxes can start from (run_command's template), from a public OCI image with optional steps (RUN, ENV, ARG, WORKDIR, USER) run in build sandboxes, or from a Dockerfile, or over another template (fromTemplate) with optional steps, with optional start and ready commands. The build is a job: the answer is the template, building, unless wait is true; get_template follows it (status building, ready or failed, the failure reason and the build log)."},
		{name: "list_templates", title: "List templates", in: reflect.TypeFor[listTemplatesArgs](), fn: h.listTemplates,
			description: "List the account's templates and the public ones (as GET /api/templates): id, name, tag, status, source image, digest and config of each."},
		{name: "get_template", title: "Get a template", in: reflect.TypeFor[getTemplateArgs](), fn: h.getTemplate,
			description: "Get a template by id or name[:tag] (as GET /api/templates/{id}): its status (building, ready, failed), failure reason, image config and the last lines of its build log."},
		{name: "delete_template", title: "Delete a template", changes: true, in: reflect.TypeFor[templateArgs](), fn: h.deleteTemplate,
			description: "Delete one of the account's templates, by id or name[:tag] (as DELETE /api/templates/{id}). Refused while running or paused sandboxes started from it; public templates are the operator's."},
	}
}

// templateResult answers the template tools that show one template.
type templateResult struct {
	Status   string            `json:"status"`
	Template contract.Template `json:"template"`
	// Finished is false when build_template answered before its build
	// ended.
	Finished *bool  `json:"finished,omitempty"`
	Note     string `json:"note,omitempty"`
}

func (h *Handler) buildTemplate(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	req, err := contract.ParseBuildTemplate(c.args)
	if err != nil {
		return nil, err
	}
	wait, _, err := c.args.Bool("wait")
	if err != nil {
		return nil, err
	}
	t, err := h.opts.Templates.Build(ctx, c.who.Principal, req.Domain())
	if err != nil {
		return nil, err
	}
	if !wait {
		res := templateResult{Status: "success", Template: contract.TemplateView(t, false), Finished: new(false),
			Note: fmt.Sprintf("The build runs in the background: follow it with get_template {\"template\": %q}.", t.ID)}
		return jsonResult(res)
	}
	t, finished, err := h.waitTemplate(ctx, c, t)
	if err != nil {
		return nil, err
	}
	res := templateResult{Status: "success", Template: contract.TemplateView(t, false), Finished: &finished}
	res.Template.Log, res.Note = logTail(t.Log, defaultLogLines)
	if !finished {
		res.Note = fmt.Sprintf("The build has not ended: follow it with get_template {\"template\": %q}. %s", t.ID, res.Note)
		return jsonResult(res)
	}
	out, err := jsonResult(res)
	if err == nil && t.Status == store.TemplateFailed {
		markFailed(out, "The build of "+t.Name+":"+t.Tag+" failed: "+t.FailureReason)
	}
	return out, err
}

// waitTemplate polls the template until its build has ended, sending a
// progress notification at each look with the log's last line. It returns
// early, with finished false, when the call is cancelled or the client
// can no longer be told.
func (h *Handler) waitTemplate(ctx context.Context, c *call, t store.Template) (cur store.Template, finished bool, err error) {
	notify := progress(c.req)
	start := h.opts.Now()
	tick := time.NewTicker(h.opts.PollInterval)
	defer tick.Stop()
	cur = t
	for {
		if ctx.Err() != nil {
			return cur, false, nil
		}
		got, err := h.opts.Templates.Get(ctx, c.who.Principal, t.ID)
		if ctx.Err() != nil {
			return cur, false, nil
		}
		if err != nil {
			return cur, false, err
		}
		cur = got
		if cur.Status != store.TemplateBuilding {
			return cur, true, nil
		}
		elapsed := h.opts.Now().Sub(start)
		msg := fmt.Sprintf("%s:%s is building after %s", cur.Name, cur.Tag, elapsed.Round(time.Second))
		if last := lastLine(cur.Log); last != "" {
			msg += ": " + last
		}
		if err := notify(ctx, elapsed.Seconds(), msg); err != nil {
			return cur, false, nil
		}
		select {
		case <-ctx.Done():
			return cur, false, nil
		case <-tick.C:
		}
	}
}

func (h *Handler) listTemplates(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	status, _, err := c.args.String("status")
	if err != nil {
		return nil, err
	}
	switch store.TemplateStatus(status) {
	case "", store.TemplateBuilding, store.TemplateReady, store.TemplateFailed:
	default:
		return nil, contract.FieldError("status must be building, ready or failed", "status")
	}
	list, err := h.opts.Templates.List(ctx, c.who.Principal)
	if err != nil {
		return nil, err
	}
	resp := contract.TemplatesResponse{Status: "success", Templates: make([]contract.Template, 0, len(list))}
	for _, t := range list {
		if !t.IsSnapshot() && (status == "" || string(t.Status) == status) {
			resp.Templates = append(resp.Templates, contract.TemplateView(t, false))
		}
	}
	return jsonResult(resp)
}

func (h *Handler) getTemplate(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	lines := int64(defaultLogLines)
	if n, ok, err := c.args.Int("log_lines"); err != nil || (ok && (n < 1 || n > maxLogLines)) {
		return nil, contract.FieldError(fmt.Sprintf("log_lines must be an integer between 1 and %d", maxLogLines), "log_lines")
	} else if ok {
		lines = n
	}
	t, err := h.findTemplate(ctx, c)
	if err != nil {
		return nil, err
	}
	res := templateResult{Status: "success", Template: contract.TemplateView(t, false)}
	res.Template.Log, res.Note = logTail(t.Log, int(lines))
	return jsonResult(res)
}

func (h *Handler) deleteTemplate(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	t, err := h.findTemplate(ctx, c)
	if err != nil {
		return nil, err
	}
	if err := h.opts.Templates.Delete(ctx, c.who.Principal, t.ID); err != nil {
		return nil, err
	}
	return jsonResult(contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, false)})
}

// findTemplate is the template the call's template argument names, as
// the CLI resolves one: an id, else name[:tag] (tag latest) among the
// account's own templates before the public ones. An id the list lacks
// is asked for (the service says whether the caller may see it).
func (h *Handler) findTemplate(ctx context.Context, c *call) (store.Template, error) {
	ref, err := requiredString(c.args, "template")
	if err != nil {
		return store.Template{}, err
	}
	list, err := h.opts.Templates.List(ctx, c.who.Principal)
	if err != nil {
		return store.Template{}, err
	}
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		tag = "latest"
	}
	var own, public string
	for _, t := range list {
		if t.ID == ref {
			return h.opts.Templates.Get(ctx, c.who.Principal, t.ID)
		}
		if t.Name != name || t.Tag != tag {
			continue
		}
		if t.AccountID != "" && own == "" {
			own = t.ID
		} else if t.AccountID == "" && public == "" {
			public = t.ID
		}
	}
	id := cmp.Or(own, public)
	if id == "" {
		if !strings.HasPrefix(ref, "tpl_") {
			return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "template %s not found", ref)
		}
		id = ref
	}
	return h.opts.Templates.Get(ctx, c.who.Principal, id)
}

// logTail is the last n lines of a build log, and a note when it is cut.
func logTail(log string, n int) (*string, string) {
	trimmed := strings.TrimSuffix(log, "\n")
	if trimmed == "" {
		return &log, ""
	}
	lines := strings.Split(trimmed, "\n")
	if len(lines) <= n {
		return &log, ""
	}
	tail := strings.Join(lines[len(lines)-n:], "\n") + "\n"
	return &tail, fmt.Sprintf("The log's last %d of %d lines (get_template's log_lines answers up to %d).", n, len(lines), maxLogLines)
}

// lastLine is the log's last line that is not empty, at most 200 bytes.
func lastLine(log string) string {
	log = strings.TrimRight(log, "\n")
	if i := strings.LastIndexByte(log, '\n'); i >= 0 {
		log = log[i+1:]
	}
	if len(log) > 200 {
		log = log[:200] + "…"
	}
	return log
}
