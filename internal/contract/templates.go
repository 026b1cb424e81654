package contract

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// BuildTemplateRequest is the body of POST /api/templates (sandboxd): an
// image or another template (fromTemplate), with steps, or a Dockerfile
// (whose FROM is the image), or neither. The other sources are accepted
// by the schema and refused (400) naming the field, so that a client
// learns what is missing rather than having them ignored.
type BuildTemplateRequest struct {
	Name  string `json:"name" jsonschema:"minLength=1,maxLength=192,description=name[:tag]: a name of 1 to 63 lower-case letters, digits, '-', '_' and '.' (starting and ending with a letter or digit) and a tag (default latest)"`
	Image string `json:"image,omitempty" jsonschema:"minLength=1,maxLength=512,description=The OCI image to build from: host/repository[:tag|@digest] (pinned by digest once resolved; a private one with registry). Absent with dockerfile or fromTemplate"`
	// Steps run over the image, in E2B's form.
	Steps      []TemplateStep `json:"steps,omitempty" jsonschema:"description=Steps run over the image in a build sandbox (E2B's TemplateStep form): RUN, COPY (ADD), ENV, ARG, WORKDIR, USER; a COPY names its uploaded files in filesHash (PUT /api/templates/files/{hash})"`
	Dockerfile string         `json:"dockerfile,omitempty" jsonschema:"maxLength=1048576,description=A Dockerfile (one FROM, which is the image; RUN, COPY and ADD of context files, ENV, ARG, WORKDIR, USER; CMD and ENTRYPOINT recorded). Not with image or steps"`
	// Context names the uploaded build context a Dockerfile's COPY and
	// ADD read from.
	Context      string `json:"context,omitempty" jsonschema:"minLength=64,maxLength=64,description=The hash of an uploaded archive (PUT /api/templates/files/{hash}) the Dockerfile's COPY and ADD sources are read from: its build context. Only with dockerfile"`
	FromTemplate string `json:"fromTemplate,omitempty" jsonschema:"maxLength=192,description=Another template to build over by name[:tag] or id (the account's own or else a public one; another account's is 404): its image and layers and config and start and ready commands are the base that steps and startCmd and readyCmd extend or override. 409 while it builds; 400 when its build failed. Not with image or dockerfile"`
	StartCmd     string `json:"startCmd,omitempty" jsonschema:"description=Run by /bin/sh in every sandbox from the template when it starts (as its USER, in its WORKDIR), and kept running; checked once at the end of the build. No memory snapshot yet: it starts again in each sandbox"`
	ReadyCmd     string `json:"readyCmd,omitempty" jsonschema:"description=Run by /bin/sh every 200 ms until it exits 0: a sandbox from the template is running from then on (at most 2 minutes, else its create fails); at the end of the build, at most the step time"`

	// Registry is the credentials of the image's pull (never answered).
	Registry *TemplateRegistry `json:"registry,omitempty" jsonschema:"description=Credentials for the image's registry: username and password (or an access token as the password) or a token alone. Kept sealed until the build has pulled the image and then deleted; never shown or logged"`
}

// TemplateRegistry is the credentials a build pulls its image with: a
// username and password (an access token used as the password, as most
// registries take it), or a registry token alone, sent as a Bearer token.
// Printing or logging one shows no secret.
type TemplateRegistry struct {
	Username string `json:"username,omitempty" jsonschema:"maxLength=256,description=The registry user (with password)"`
	Password string `json:"password,omitempty" jsonschema:"maxLength=16384,description=The password or access token (with username)"`
	Token    string `json:"token,omitempty" jsonschema:"maxLength=16384,description=A registry token sent as is (Bearer) instead of username and password"`
}

// String shows which fields are set, never a secret.
func (r TemplateRegistry) String() string { return r.credentials().String() }

// GoString keeps %#v from printing the fields.
func (r TemplateRegistry) GoString() string { return "contract.TemplateRegistry{" + r.String() + "}" }

// LogValue keeps slog from logging the fields.
func (r TemplateRegistry) LogValue() slog.Value { return slog.StringValue(r.String()) }

func (r TemplateRegistry) credentials() oci.Credentials {
	return oci.Credentials{Username: r.Username, Password: r.Password, RegistryToken: r.Token}
}

// TemplateStep is one build step, as E2B's SDK sends it: args by type are
// RUN [command] or [command, user]; ENV and ARG [name, value, ...];
// WORKDIR [path]; USER [user]; COPY [src, dest, user, mode] from the
// uploaded files named by FilesHash.
type TemplateStep struct {
	Type      string   `json:"type" jsonschema:"minLength=1,description=RUN, COPY (or ADD), ENV, ARG, WORKDIR or USER"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty" jsonschema:"description=COPY: the hash the step's files were uploaded under (PUT /api/templates/files/{hash})"`
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
	if req.Context, _, err = o.str("context"); err != nil {
		return req, err
	}
	if req.FromTemplate, _, err = o.str("fromTemplate"); err != nil {
		return req, err
	}
	if o.present("steps") {
		if err := json.Unmarshal(o["steps"], &req.Steps); err != nil {
			return req, typeError("array of steps ({\"type\", \"args\"})", o["steps"], []any{"steps"})
		}
	}
	if o.present("registry") {
		if req.Registry, err = parseRegistry(o["registry"]); err != nil {
			return req, err
		}
	}
	if req.Name == "" {
		return req, FieldError("name: required", "name")
	}
	if req.Image == "" && req.Dockerfile == "" && req.FromTemplate == "" {
		return req, FieldError("image: required (or dockerfile, or fromTemplate)", "image")
	}
	return req, nil
}

// parseRegistry reads the registry object: string fields username,
// password and token only (the service checks which go together).
func parseRegistry(raw json.RawMessage) (*TemplateRegistry, error) {
	if jsonKind(raw) != "object" {
		return nil, typeError("object", raw, []any{"registry"})
	}
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, typeError("object", raw, []any{"registry"})
	}
	var r TemplateRegistry
	for name := range o {
		var dst *string
		switch name {
		case "username":
			dst = &r.Username
		case "password":
			dst = &r.Password
		case "token":
			dst = &r.Token
		default:
			return nil, FieldError(fmt.Sprintf("registry.%s: unknown field; registry takes username and password, or token", clipField(name)), "registry", name)
		}
		s, _, err := o.str(name, "registry")
		if err != nil {
			return nil, err
		}
		*dst = s
	}
	return &r, nil
}

// clipField bounds a client's field name in a message.
func clipField(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Domain is the body as the templates service's request.
func (r BuildTemplateRequest) Domain() templates.BuildRequest {
	var steps json.RawMessage
	if len(r.Steps) > 0 {
		steps, _ = json.Marshal(r.Steps)
	}
	req := templates.BuildRequest{
		Name: r.Name, Image: r.Image, Dockerfile: r.Dockerfile, Steps: steps, Context: r.Context,
		FromTemplate: r.FromTemplate, StartCmd: r.StartCmd, ReadyCmd: r.ReadyCmd,
	}
	if r.Registry != nil {
		c := r.Registry.credentials()
		req.Registry = &c
	}
	return req
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
	if t.Digest != "" && t.Status == store.TemplateReady {
		// A template built over another names its parent's digest
		// while it builds (and after it failed); the API shows what a
		// ready one was pinned to.
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

// TemplateFilesResponse answers PUT and GET /api/templates/files/{hash}:
// whether the account has build files (an archive) under hash.
type TemplateFilesResponse struct {
	Status  string `json:"status" jsonschema:"enum=success"`
	Hash    string `json:"hash"`
	Present bool   `json:"present"`
	// Size is the archive's as uploaded; 0 when absent.
	Size int64 `json:"size"`
	// Entries and Bytes count what a PUT's archive holds.
	Entries int   `json:"entries,omitempty"`
	Bytes   int64 `json:"bytes,omitempty"`
}

// SaveTemplateRequest is the body of POST /api/sandboxes/{id}/template
// (sandboxd): the name of the template the running sandbox's files are
// saved as, in the sandbox's account.
type SaveTemplateRequest struct {
	Name      string `json:"name" jsonschema:"minLength=1,maxLength=192,description=name[:tag] of the new template (tag latest by default); 409 when the account has one of that name and tag"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r SaveTemplateRequest) ActingFor() string { return r.AccountID }

// ParseSaveTemplate validates the body of POST
// /api/sandboxes/{id}/template; the templates service checks the name.
func ParseSaveTemplate(a Args) (SaveTemplateRequest, error) {
	o := a.o
	var req SaveTemplateRequest
	var err error
	if req.Name, _, err = o.str("name"); err != nil {
		return req, err
	}
	if req.Name == "" {
		return req, FieldError("name: required", "name")
	}
	req.AccountID, err = o.accountID()
	return req, err
}
