package templatespec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Wire is the steps JSON: the body E2B's SDK sends to start a build
// (TemplateBuildStartV2, POST /v2/templates/{templateID}/builds/{buildID}),
// which sandboxd's own API takes as well. Fields the SDK adds that the
// definition does not need (a COPY's forceUpload, resolveSymlinks, gzip) are
// ignored, as are unknown ones, as E2B's server does.
type Wire struct {
	FromImage         string        `json:"fromImage,omitempty"`
	FromTemplate      string        `json:"fromTemplate,omitempty"`
	FromImageRegistry *WireRegistry `json:"fromImageRegistry,omitempty"`
	Force             bool          `json:"force,omitempty"`
	Steps             []WireStep    `json:"steps"`
	StartCmd          string        `json:"startCmd,omitempty"`
	ReadyCmd          string        `json:"readyCmd,omitempty"`
}

// WireRegistry is E2B's FromImageRegistry, a union on Type: "registry"
// (Username, Password), "aws" or "gcp".
type WireRegistry struct {
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// WireStep is E2B's TemplateStep. Args by Type:
//
//	RUN      [command] or [command, user]
//	COPY     [src, dest] to [src, dest, user, mode]; user and mode may be "";
//	         mode is octal ("0755"); filesHash names the uploaded files
//	ENV, ARG [name, value, name, value, ...]
//	WORKDIR  [path]
//	USER     [user]
//
// Type is read without regard to case, and ADD is COPY, as E2B's server
// reads them.
type WireStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// FromJSON reads and validates the steps JSON (Wire). Errors are of class
// errdefs.ErrInvalid, or errdefs.ErrTooLarge for a body over
// lim.JSONBytes, and name the field: "steps[2].args[3]: ...".
func FromJSON(data []byte, lim Limits) (*Template, error) {
	lim = lim.orDefaults()
	if len(data) > lim.JSONBytes {
		return nil, errdefs.Newf(errdefs.ErrTooLarge, "the template definition is %d bytes, the limit is %d", len(data), lim.JSONBytes)
	}
	var w Wire
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalid, err, "the template definition is not valid JSON for a template: "+jsonProblem(err))
	}
	return w.Template(lim)
}

// jsonProblem says where a JSON error is, without echoing the input.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case asErr(err, &te):
		return fmt.Sprintf("%s must be %s, not %s", te.Field, jsonType(te.Type.Kind().String()), te.Value)
	case asErr(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	return "cannot be decoded"
}

func jsonType(kind string) string {
	switch kind {
	case "slice":
		return "an array"
	case "struct", "ptr":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a " + kind
}

// Template turns w into a validated Template.
func (w *Wire) Template(lim Limits) (*Template, error) {
	lim = lim.orDefaults()
	t := &Template{StartCmd: w.StartCmd, ReadyCmd: w.ReadyCmd, Force: w.Force}
	switch {
	case w.FromImage != "" && w.FromTemplate != "":
		return nil, errdefs.New(errdefs.ErrInvalid, "fromImage and fromTemplate: give one base, not both")
	case w.FromImage != "":
		t.Base = Base{Kind: BaseImage, Ref: w.FromImage}
	case w.FromTemplate != "":
		t.Base = Base{Kind: BaseTemplate, Ref: w.FromTemplate}
	default:
		return nil, errdefs.New(errdefs.ErrInvalid, "fromImage or fromTemplate is required")
	}
	if r := w.FromImageRegistry; r != nil {
		auth, err := r.auth()
		if err != nil {
			return nil, err
		}
		t.Base.Auth = auth
	}
	if err := t.Base.validate(lim); err != nil {
		return nil, fieldErr(baseField(w), err)
	}
	if len(w.Steps) > lim.Steps {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "steps: %d steps, the limit is %d", len(w.Steps), lim.Steps)
	}
	var ev envBudget
	for i, ws := range w.Steps {
		s, err := ws.step(i)
		if err != nil {
			return nil, err
		}
		if err := s.validate(lim, &ev); err != nil {
			return nil, fieldErr(fmt.Sprintf("steps[%d] (%s)", i, s.Kind), err)
		}
		t.Steps = append(t.Steps, s)
	}
	if err := checkText("startCmd", t.StartCmd, lim.CommandBytes); err != nil {
		return nil, err
	}
	if err := checkText("readyCmd", t.ReadyCmd, lim.CommandBytes); err != nil {
		return nil, err
	}
	return t, nil
}

func baseField(w *Wire) string {
	if w.FromImageRegistry != nil && w.FromImage != "" {
		return "fromImage, fromImageRegistry"
	}
	if w.FromImage != "" {
		return "fromImage"
	}
	return "fromTemplate"
}

func (r *WireRegistry) auth() (*RegistryAuth, error) {
	switch r.Type {
	case "registry":
		return &RegistryAuth{Kind: AuthBasic, Username: r.Username, Password: r.Password}, nil
	case "aws":
		return &RegistryAuth{Kind: AuthAWS, AWSAccessKeyID: r.AWSAccessKeyID, AWSSecretAccessKey: r.AWSSecretAccessKey, AWSRegion: r.AWSRegion}, nil
	case "gcp":
		return &RegistryAuth{Kind: AuthGCP, GCPServiceAccountJSON: r.ServiceAccountJSON}, nil
	}
	return nil, errdefs.Newf(errdefs.ErrInvalid, "fromImageRegistry.type %q is not one of registry, aws, gcp", clip(r.Type))
}

// step reads the i-th step's args; what they mean is checked after, by
// Step.validate.
func (ws *WireStep) step(i int) (Step, error) {
	at := func(j int) string { return fmt.Sprintf("steps[%d].args[%d]", i, j) }
	kind := StepKind(strings.ToUpper(ws.Type))
	if kind == "ADD" {
		kind = StepCopy
	}
	s := Step{Kind: kind, Force: ws.Force}
	args := ws.Args
	arity := func(min, max int, shape string) error {
		if len(args) < min || len(args) > max {
			return errdefs.Newf(errdefs.ErrInvalid, "steps[%d].args: %s takes %s, got %d arguments", i, kind, shape, len(args))
		}
		return nil
	}
	switch kind {
	case StepRun:
		if err := arity(1, 2, "[command] or [command, user]"); err != nil {
			return Step{}, err
		}
		s.Command = args[0]
		if len(args) == 2 {
			s.User = args[1]
		}
	case StepCopy:
		if err := arity(2, 4, "[src, dest, user, mode] (user and mode optional)"); err != nil {
			return Step{}, err
		}
		s.Src, s.Dest, s.FilesHash = args[0], args[1], ws.FilesHash
		if s.FilesHash == "" {
			return Step{}, errdefs.Newf(errdefs.ErrInvalid, "steps[%d].filesHash: a COPY needs the hash of its uploaded files", i)
		}
		if len(args) >= 3 {
			s.User = args[2]
		}
		if len(args) == 4 && args[3] != "" {
			m, err := strconv.ParseUint(args[3], 8, 32)
			if err != nil {
				return Step{}, errdefs.Newf(errdefs.ErrInvalid, "%s: mode %q is not an octal number such as 0755", at(3), clip(args[3]))
			}
			s.Mode = fs.FileMode(m)
		}
	case StepEnv, StepArg:
		if len(args) == 0 || len(args)%2 != 0 {
			return Step{}, errdefs.Newf(errdefs.ErrInvalid, "steps[%d].args: %s takes [name, value, ...] in pairs, got %d arguments", i, kind, len(args))
		}
		for j := 0; j < len(args); j += 2 {
			s.Env = append(s.Env, EnvVar{Name: args[j], Value: args[j+1]})
		}
	case StepWorkdir:
		if err := arity(1, 1, "[path]"); err != nil {
			return Step{}, err
		}
		s.Path = args[0]
	case StepUser:
		if err := arity(1, 1, "[user]"); err != nil {
			return Step{}, err
		}
		s.User = args[0]
	default:
		return Step{}, errdefs.Newf(errdefs.ErrInvalid, "steps[%d].type %q is not one of RUN, COPY, ADD, ENV, ARG, WORKDIR, USER", i, clip(ws.Type))
	}
	return s, nil
}

// ToWire is t as the steps JSON, credentials included: it is for a build
// request to send, never for storing.
func (t *Template) ToWire() *Wire {
	w := &Wire{StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, Force: t.Force, Steps: make([]WireStep, 0, len(t.Steps))}
	switch t.Base.Kind {
	case BaseImage:
		w.FromImage = t.Base.Ref
	case BaseTemplate, BaseBuiltin:
		w.FromTemplate = t.Base.Ref
	}
	if a := t.Base.Auth; a != nil {
		typ := string(a.Kind)
		if a.Kind == AuthBasic {
			typ = "registry" // E2B's name for it
		}
		w.FromImageRegistry = &WireRegistry{
			Type: typ, Username: a.Username, Password: a.Password,
			AWSAccessKeyID: a.AWSAccessKeyID, AWSSecretAccessKey: a.AWSSecretAccessKey, AWSRegion: a.AWSRegion,
			ServiceAccountJSON: a.GCPServiceAccountJSON,
		}
	}
	for _, s := range t.Steps {
		ws := WireStep{Type: string(s.Kind), Force: s.Force}
		switch s.Kind {
		case StepRun:
			ws.Args = []string{s.Command}
			if s.User != "" {
				ws.Args = append(ws.Args, s.User)
			}
		case StepCopy:
			mode := ""
			if s.Mode != 0 {
				mode = fmt.Sprintf("%04o", uint32(s.Mode))
			}
			ws.Args, ws.FilesHash = []string{s.Src, s.Dest, s.User, mode}, s.FilesHash
		case StepEnv, StepArg:
			for _, e := range s.Env {
				ws.Args = append(ws.Args, e.Name, e.Value)
			}
		case StepWorkdir:
			ws.Args = []string{s.Path}
		case StepUser:
			ws.Args = []string{s.User}
		}
		w.Steps = append(w.Steps, ws)
	}
	return w
}

// fieldErr puts the field's name before err's message.
func fieldErr(field string, err error) error { return fmt.Errorf("%s: %w", field, err) }

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }
