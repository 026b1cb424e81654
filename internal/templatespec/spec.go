package templatespec

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Template is what a build starts from and what it does.
type Template struct {
	Base  Base   `json:"base"`
	Steps []Step `json:"steps,omitempty"`
	// StartCmd is run by a shell when the build is done, and keeps running
	// in every sandbox started from the template; empty: none.
	StartCmd string `json:"startCmd,omitempty"`
	// ReadyCmd is run by a shell until it exits 0; the template's state is
	// kept from that moment. Empty: ready as soon as StartCmd has started.
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Force rebuilds every step, whatever the cache holds (E2B's "force").
	Force bool `json:"force,omitempty"`
}

// BaseKind says what a Base.Ref names.
type BaseKind string

// The bases.
const (
	BaseImage    BaseKind = "image"    // an OCI image reference, from any registry
	BaseTemplate BaseKind = "template" // another template, by name[:tag] or id
	BaseBuiltin  BaseKind = "builtin"  // one of the images sandboxd builds itself
)

// Base is where a template starts.
type Base struct {
	Kind BaseKind `json:"kind"`
	// Ref is the image reference (BaseImage, e.g. "python:3.12" or
	// "registry.example/org/img@sha256:…"), the template (BaseTemplate) or the
	// built-in's name (BaseBuiltin). Resolving it, and pinning it by digest,
	// is the build runner's.
	Ref string `json:"ref"`
	// Auth logs in to the image's registry; nil: anonymous. Never stored
	// with the definition: it has no JSON form here.
	Auth *RegistryAuth `json:"-"`
}

// RegistryAuthKind is how RegistryAuth logs in.
type RegistryAuthKind string

// The ways to log in to a registry: E2B's three (its "registry" is Basic).
const (
	AuthBasic RegistryAuthKind = "basic" // user name and password (or token), any registry
	AuthAWS   RegistryAuthKind = "aws"   // Amazon ECR, with an access key
	AuthGCP   RegistryAuthKind = "gcp"   // Google Artifact Registry, with a service account
)

// RegistryAuth holds registry credentials. Its String, GoString, LogValue
// and MarshalJSON show the kind only, so that a template printed, logged
// or encoded by mistake never shows a secret.
type RegistryAuth struct {
	Kind                  RegistryAuthKind
	Username, Password    string // AuthBasic
	AWSAccessKeyID        string // AuthAWS
	AWSSecretAccessKey    string // AuthAWS
	AWSRegion             string // AuthAWS
	GCPServiceAccountJSON string // AuthGCP
}

func (a RegistryAuth) redacted() string { return "registry auth (" + string(a.Kind) + ", redacted)" }

// String hides the credentials.
func (a RegistryAuth) String() string { return a.redacted() }

// GoString hides the credentials from %#v.
func (a RegistryAuth) GoString() string { return a.redacted() }

// LogValue hides the credentials from slog.
func (a RegistryAuth) LogValue() slog.Value { return slog.StringValue(a.redacted()) }

// MarshalJSON hides the credentials: they are carried to the build runner
// by another way than the definition (see Base.Auth).
func (a RegistryAuth) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"kind": string(a.Kind), "credentials": "redacted"})
}

// StepKind is what a step does; the names are E2B's step types.
type StepKind string

// The steps.
const (
	// StepRun runs Command with the build's shell, as User if set (for this
	// step only) or else as the current user, in the current directory, with
	// the ENV and ARG values set so far.
	StepRun StepKind = "RUN"
	// StepCopy copies Src, a path (or glob) in the uploaded files named by
	// FilesHash, to Dest (relative: to the current directory), owned by User
	// ("user[:group]"; empty: the current user) with Mode (0: as uploaded).
	StepCopy StepKind = "COPY"
	// StepEnv sets Env for every later step and for sandboxes from the
	// template.
	StepEnv StepKind = "ENV"
	// StepArg sets Env for the later steps of the build only, like a
	// Dockerfile's ARG. (E2B's server takes ARG as ENV; E2B's SDK never
	// sends it.)
	StepArg StepKind = "ARG"
	// StepWorkdir makes Path the current directory, creating it; a relative
	// Path is taken from the current directory.
	StepWorkdir StepKind = "WORKDIR"
	// StepUser makes User ("user[:group]", names or ids) the current user.
	StepUser StepKind = "USER"
)

// Step is one change to the template's filesystem or build state. Which
// fields count depends on Kind (see the StepKind constants); the others are
// empty.
type Step struct {
	Kind      StepKind    `json:"kind"`
	Command   string      `json:"command,omitempty"`   // RUN
	User      string      `json:"user,omitempty"`      // RUN, COPY, USER
	Src       string      `json:"src,omitempty"`       // COPY
	Dest      string      `json:"dest,omitempty"`      // COPY
	FilesHash string      `json:"filesHash,omitempty"` // COPY
	Mode      fs.FileMode `json:"mode,omitempty"`      // COPY
	Env       []EnvVar    `json:"env,omitempty"`       // ENV, ARG
	Path      string      `json:"path,omitempty"`      // WORKDIR
	// Force rebuilds this step and, since the cache is a chain, every step
	// after it.
	Force bool `json:"force,omitempty"`
	// Line is the Dockerfile line the step came from, for messages; 0 when
	// it came from JSON. It is not part of the step's cache key.
	Line int `json:"line,omitempty"`
}

// EnvVar is one name and its value.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Validate checks t against lim (zero fields: DefaultLimits). The error,
// of class errdefs.ErrInvalid, names the step by its number from 1.
func (t *Template) Validate(lim Limits) error {
	return t.validate(lim.orDefaults())
}

func (t *Template) validate(lim Limits) error {
	if err := t.Base.validate(lim); err != nil {
		return err
	}
	if len(t.Steps) > lim.Steps {
		return errdefs.Newf(errdefs.ErrInvalid, "the template has %d steps, the limit is %d", len(t.Steps), lim.Steps)
	}
	var ev envBudget
	for i := range t.Steps {
		if err := t.Steps[i].validate(lim, &ev); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, t.Steps[i].Kind, err)
		}
	}
	if err := checkText("start command", t.StartCmd, lim.CommandBytes); err != nil {
		return err
	}
	return checkText("ready command", t.ReadyCmd, lim.CommandBytes)
}

func (b *Base) validate(lim Limits) error {
	switch b.Kind {
	case BaseImage, BaseTemplate:
		if err := checkToken("base "+string(b.Kind), b.Ref, lim.FieldBytes); err != nil {
			return err
		}
	case BaseBuiltin:
		if err := ValidateName(b.Ref); err != nil {
			return fmt.Errorf("base builtin: %w", err)
		}
	case "":
		return errdefs.New(errdefs.ErrInvalid, "the template has no base (an image, a template or a built-in)")
	default:
		return errdefs.Newf(errdefs.ErrInvalid, "base kind %q is not one of image, template, builtin", clip(string(b.Kind)))
	}
	if b.Auth != nil {
		if b.Kind != BaseImage {
			return errdefs.Newf(errdefs.ErrInvalid, "registry credentials are for an image base, not a %s", b.Kind)
		}
		return b.Auth.validate(lim)
	}
	return nil
}

func (a *RegistryAuth) validate(lim Limits) error {
	// A service account is a JSON document, larger than a field.
	need := func(field, v string) error {
		max := lim.FieldBytes
		if a.Kind == AuthGCP {
			max = lim.JSONBytes
		}
		switch {
		case v == "":
			return errdefs.Newf(errdefs.ErrInvalid, "registry credentials (%s): %s is empty", a.Kind, field)
		case len(v) > max:
			return errdefs.Newf(errdefs.ErrInvalid, "registry credentials (%s): %s is longer than %d bytes", a.Kind, field, max)
		}
		return nil
	}
	var err error
	switch a.Kind {
	case AuthBasic:
		err = firstErr(need("username", a.Username), need("password", a.Password))
	case AuthAWS:
		err = firstErr(need("access key id", a.AWSAccessKeyID), need("secret access key", a.AWSSecretAccessKey), need("region", a.AWSRegion))
	case AuthGCP:
		err = need("service account JSON", a.GCPServiceAccountJSON)
	default:
		err = errdefs.Newf(errdefs.ErrInvalid, "registry credentials: type %q is not one of registry, aws, gcp", clip(string(a.Kind)))
	}
	return err
}

// envBudget counts what ENV and ARG set across a template.
type envBudget struct{ vars, bytes int }

func (s *Step) validate(lim Limits, ev *envBudget) error {
	switch s.Kind {
	case StepRun:
		if strings.TrimSpace(s.Command) == "" {
			return errdefs.New(errdefs.ErrInvalid, "the command is empty")
		}
		if err := checkText("the command", s.Command, lim.CommandBytes); err != nil {
			return err
		}
		if s.User != "" {
			return checkUser(s.User, lim)
		}
	case StepCopy:
		if err := checkSrc(s.Src, lim); err != nil {
			return err
		}
		if err := checkWord("the destination", s.Dest, lim.FieldBytes); err != nil {
			return err
		}
		if s.FilesHash != "" && !isFilesHash(s.FilesHash) {
			return errdefs.Newf(errdefs.ErrInvalid, "the files hash %q is not 64 lower-case hex digits (a SHA-256)", clip(s.FilesHash))
		}
		if s.User != "" {
			if err := checkUser(s.User, lim); err != nil {
				return err
			}
		}
		if s.Mode&^0o7777 != 0 {
			return errdefs.Newf(errdefs.ErrInvalid, "the mode %#o is more than permission bits (at most 07777)", uint32(s.Mode))
		}
	case StepEnv, StepArg:
		if len(s.Env) == 0 {
			return errdefs.Newf(errdefs.ErrInvalid, "%s sets no variable", s.Kind)
		}
		for _, e := range s.Env {
			if err := checkEnv(e, lim, ev); err != nil {
				return err
			}
		}
	case StepWorkdir:
		return checkWord("the directory", s.Path, lim.FieldBytes)
	case StepUser:
		return checkUser(s.User, lim)
	case "":
		return errdefs.New(errdefs.ErrInvalid, "the step has no kind")
	default:
		return errdefs.Newf(errdefs.ErrInvalid, "step kind %q is not one of RUN, COPY, ENV, ARG, WORKDIR, USER", clip(string(s.Kind)))
	}
	return nil
}

func checkEnv(e EnvVar, lim Limits, ev *envBudget) error {
	if e.Name == "" {
		return errdefs.New(errdefs.ErrInvalid, "a variable has no name")
	}
	if strings.ContainsAny(e.Name, "= \t\r\n\x00") {
		return errdefs.Newf(errdefs.ErrInvalid, "variable name %q must not contain '=', spaces or NUL", clip(e.Name))
	}
	if len(e.Name) > lim.FieldBytes {
		return errdefs.Newf(errdefs.ErrInvalid, "variable name %q is longer than %d bytes", clip(e.Name), lim.FieldBytes)
	}
	if strings.IndexByte(e.Value, 0) >= 0 {
		return errdefs.Newf(errdefs.ErrInvalid, "variable %s: the value contains NUL", clip(e.Name))
	}
	if len(e.Value) > lim.EnvValueBytes {
		return errdefs.Newf(errdefs.ErrInvalid, "variable %s: the value is %d bytes, the limit is %d", clip(e.Name), len(e.Value), lim.EnvValueBytes)
	}
	ev.vars++
	ev.bytes += len(e.Name) + len(e.Value)
	if ev.vars > lim.EnvVars {
		return errdefs.Newf(errdefs.ErrInvalid, "the template sets more than %d variables", lim.EnvVars)
	}
	if ev.bytes > lim.EnvBytes {
		return errdefs.Newf(errdefs.ErrInvalid, "the template's variables take more than %d bytes", lim.EnvBytes)
	}
	return nil
}

// checkSrc keeps a COPY source inside the uploaded files: relative, and
// not climbing out with "..".
func checkSrc(src string, lim Limits) error {
	if err := checkWord("the source", src, lim.FieldBytes); err != nil {
		return err
	}
	if path.IsAbs(src) {
		return errdefs.Newf(errdefs.ErrInvalid, "the source %q is absolute; it must be a path in the uploaded files", clip(src))
	}
	if c := path.Clean(src); c == ".." || strings.HasPrefix(c, "../") {
		return errdefs.Newf(errdefs.ErrInvalid, "the source %q climbs out of the uploaded files", clip(src))
	}
	return nil
}

// checkUser takes "user[:group]", names or numeric ids.
func checkUser(u string, lim Limits) error {
	if err := checkToken("the user", u, lim.FieldBytes); err != nil {
		return err
	}
	user, group, hasGroup := strings.Cut(u, ":")
	if user == "" || hasGroup && (group == "" || strings.Contains(group, ":")) {
		return errdefs.Newf(errdefs.ErrInvalid, "the user %q is not user[:group]", clip(u))
	}
	return nil
}

// checkWord takes a non-empty string without spaces at its ends, control
// characters or NUL, at most max bytes.
func checkWord(what, s string, max int) error {
	if s == "" {
		return errdefs.Newf(errdefs.ErrInvalid, "%s is empty", what)
	}
	if len(s) > max {
		return errdefs.Newf(errdefs.ErrInvalid, "%s is %d bytes, the limit is %d", what, len(s), max)
	}
	if strings.TrimSpace(s) != s {
		return errdefs.Newf(errdefs.ErrInvalid, "%s %q has spaces at its ends", what, clip(s))
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return errdefs.Newf(errdefs.ErrInvalid, "%s %q contains a control character", what, clip(s))
		}
	}
	return nil
}

// checkToken is checkWord without spaces anywhere: a reference or a name.
func checkToken(what, s string, max int) error {
	if err := checkWord(what, s, max); err != nil {
		return err
	}
	if strings.ContainsAny(s, " \u00a0") {
		return errdefs.Newf(errdefs.ErrInvalid, "%s %q contains a space", what, clip(s))
	}
	return nil
}

// checkText takes any text without NUL (which no exec can pass), at most
// max bytes; empty is fine.
func checkText(what, s string, max int) error {
	if len(s) > max {
		return errdefs.Newf(errdefs.ErrInvalid, "%s is %d bytes, the limit is %d", what, len(s), max)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return errdefs.Newf(errdefs.ErrInvalid, "%s contains NUL", what)
	}
	return nil
}

// isFilesHash: a hex SHA-256, as E2B's SDK computes it. It becomes part of
// a blob's name, so nothing else gets through.
func isFilesHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
