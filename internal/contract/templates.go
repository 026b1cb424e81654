package contract

import (
	"encoding/json"

	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// BuildTemplateRequest is the body of POST /api/templates (sandboxd): an
// image, with steps or a Dockerfile (whose FROM is the image) or neither.
// The other sources are accepted by the schema and refused (400) naming
// the field, so that a client learns what is missing rather than having
// them ignored.
type BuildTemplateRequest struct {
	Name  string `json:"name" jsonschema:"minLength=1,maxLength=192,description=name[:tag]: a name of 1 to 63 lower-case letters, digits, '-', '_' and '.' (starting and ending with a letter or digit) and a tag (default latest)"`
	Image string `json:"image,omitempty" jsonschema:"minLength=1,maxLength=512,description=The OCI image to build from: host/repository[:tag|@digest] (a public image; pinned by digest once resolved). Absent with dockerfile"`
	// Steps run over the image, in E2B's form.
	Steps      []TemplateStep `json:"steps,omitempty" jsonschema:"description=Steps run over the image in a build sandbox (E2B's TemplateStep form): RUN, ENV, ARG, WORKDIR, USER; COPY and ADD are refused (400) for now"`
	Dockerfile string         `json:"dockerfile,omitempty" jsonschema:"maxLength=1048576,description=A Dockerfile (one FROM, which is the image; RUN, ENV, ARG, WORKDIR, USER, CMD and ENTRYPOINT recorded; COPY and ADD are refused (400) for now). Not with image or steps"`
	// Not supported yet: each is refused with 400 naming it.
	FromTemplate string          `json:"fromTemplate,omitempty" jsonschema:"description=Not supported yet (400)"`
	StartCmd     string          `json:"startCmd,omitempty" jsonschema:"description=Run by /bin/sh in every sandbox from the template when it starts (as its USER, in its WORKDIR), and kept running; checked once at the end of the build. No memory snapshot yet: it starts again in each sandbox"`
	ReadyCmd     string          `json:"readyCmd,omitempty" jsonschema:"description=Run by /bin/sh every 200 ms until it exits 0: a sandbox from the template is running from then on (at most 2 minutes, else its create fails); at the end of the build, at most the step time"`
	Registry     json.RawMessage `json:"registry,omitempty" jsonschema:"description=Registry credentials: not supported yet (400); only public images are built for now"`
}

// TemplateStep is one build step, as E2B's SDK sends it: args by type are
// RUN [command] or [command, user]; ENV and ARG [name, value, ...];
// WORKDIR [path]; USER [user]; COPY [src, dest, user, mode] (refused for
// now).
type TemplateStep struct {
	Type      string   `json:"type" jsonschema:"minLength=1,description=RUN, ENV, ARG, WORKDIR or USER (COPY and ADD: not supported yet)"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty" jsonschema:"description=Rebuild this step and every later one whatever the cache holds"`
}

// ActingFor implements ActsFor: templates are the caller's account's.
func (BuildTemplateRequest) ActingFor() string { return "" }

// ParseBuildTemplate validates the body of POST /api/templates as far as
// the contract goes (types); the templates service checks the rest.
func ParseBuildTemplate(a Args) (BuildTemplateRequest, error) {
	o := a.o
	var req BuildTemplateRequest
	var err error
	if req.Name, _, err = o.str("name"); err != nil {
		return req, err
	}
	if req.Image, _, err = o.str("image"); err != nil {
		return req, err
	}
	if req.Dockerfile, _, err = o.str("dockerfile"); err != nil {
		return req, err
	}
	if req.StartCmd, _, err = o.str("startCmd"); err != nil {
		return req, err
	}
	if req.ReadyCmd, _, err = o.str("readyCmd"); err != nil {
		return req, err
	}
	for _, f := range []string{"fromTemplate"} {
		if o.present(f) {
			return req, FieldError(f+": not supported yet; templates are built from an image (\"image\"), with steps or a Dockerfile, for now", f)
		}
	}
	if o.present("steps") {
		if err := json.Unmarshal(o["steps"], &req.Steps); err != nil {
			return req, typeError("array of steps ({\"type\", \"args\"})", o["steps"], []any{"steps"})
		}
	}
	if o.present("registry") {
		return req, FieldError("registry: credentials are not supported yet; templates are built from public images for now", "registry")
	}
	if req.Name == "" {
		return req, FieldError("name: required", "name")
	}
	if req.Image == "" && req.Dockerfile == "" {
		return req, FieldError("image: required", "image")
	}
	return req, nil
}

// Domain is the body as the templates service's request.
func (r BuildTemplateRequest) Domain() templates.BuildRequest {
	var steps json.RawMessage
	if len(r.Steps) > 0 {
		steps, _ = json.Marshal(r.Steps)
	}
	return templates.BuildRequest{
		Name: r.Name, Image: r.Image, Dockerfile: r.Dockerfile, Steps: steps,
		FromTemplate: r.FromTemplate != "", StartCmd: r.StartCmd, ReadyCmd: r.ReadyCmd, Credentials: len(r.Registry) > 0,
	}
}

// Template is a template as the API shows it (sandboxd).
type Template struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Tag    string `json:"tag"`
	Status string `json:"status" jsonschema:"enum=building,enum=ready,enum=failed"`
	// Public templates are the operator's, offered to every account.
	Public bool `json:"public"`
	// Source is the image reference as it was asked for.
	Source string `json:"source"`
	// Digest is the image manifest's digest the source was pinned to.
	Digest *string `json:"digest" jsonschema:"nullable,description=The image manifest's digest the source was pinned to; null until ready"`
	// Config is what a sandbox takes of the image's config.
	Config        *TemplateConfig `json:"config" jsonschema:"nullable,description=The image's config; null until ready"`
	FailureReason *string         `json:"failureReason" jsonschema:"nullable,description=Why the build failed; null unless failed"`
	// Log is the build's log (its last 64 KiB); only GET /api/templates/{id}
	// answers it.
	Log       *string `json:"log,omitempty" jsonschema:"description=The build's log, its last 64 KiB (GET /api/templates/{id} only)"`
	CreatedAt string  `json:"createdAt"`
	UpdatedAt string  `json:"updatedAt"`
}

// TemplateConfig is what a sandbox takes of an image's config: Env is
// added to its environment, WorkingDir and User are the defaults of its
// commands; Entrypoint and Cmd are recorded (not run yet).
type TemplateConfig struct {
	Env          []string `json:"env"`
	WorkingDir   string   `json:"workingDir"`
	User         string   `json:"user"`
	Entrypoint   []string `json:"entrypoint"`
	Cmd          []string `json:"cmd"`
	ExposedPorts []string `json:"exposedPorts"`
}

// TemplateResponse answers POST /api/templates (202), GET and DELETE
// /api/templates/{id}.
type TemplateResponse struct {
	Status   string   `json:"status" jsonschema:"enum=success"`
	Template Template `json:"template"`
}

// TemplatesResponse answers GET /api/templates.
type TemplatesResponse struct {
	Status    string     `json:"status" jsonschema:"enum=success"`
	Templates []Template `json:"templates"`
}

// TemplateView is t as the API shows it; withLog adds its build log.
func TemplateView(t store.Template, withLog bool) Template {
	v := Template{
		ID: t.ID, Name: t.Name, Tag: t.Tag, Status: string(t.Status), Public: t.AccountID == "", Source: t.Source,
		CreatedAt: FormatTime(t.CreatedAt), UpdatedAt: FormatTime(t.UpdatedAt),
	}
	// The row names its digest from the build's resolve on (so that the
	// image is not collected meanwhile); the API shows it once ready.
	if t.Digest != "" && t.Status == store.TemplateReady {
		d := t.Digest
		v.Digest = &d
	}
	if t.Config != "" {
		var c oci.Config
		if json.Unmarshal([]byte(t.Config), &c) == nil {
			v.Config = &TemplateConfig{Env: orEmpty(c.Env), WorkingDir: c.WorkingDir, User: c.User,
				Entrypoint: orEmpty(c.Entrypoint), Cmd: orEmpty(c.Cmd), ExposedPorts: orEmpty(c.ExposedPorts)}
		}
	}
	if t.Status == store.TemplateFailed {
		r := t.FailureReason
		v.FailureReason = &r
	}
	if withLog {
		l := t.Log
		v.Log = &l
	}
	return v
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
