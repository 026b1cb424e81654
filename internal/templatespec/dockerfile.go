package templatespec

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// ParseOptions are what a Dockerfile is read with besides its text.
type ParseOptions struct {
	// BuildArgs are the values of the Dockerfile's ARGs (docker build's
	// --build-arg); an ARG the Dockerfile does not declare is ignored, as
	// Docker does.
	BuildArgs map[string]string
	// BaseEnv is the base image's environment, when it is known, so that
	// "ENV PATH=$PATH:/opt/bin" sees the image's PATH, as Docker does.
	// Without it, a variable the Dockerfile does not set expands to "": the
	// build runner parses again with it once the base is resolved (parsing
	// is cheap and has no effects); a request handler parses without it to
	// refuse a bad Dockerfile before anything runs.
	BaseEnv map[string]string
	Limits  Limits
}

// ParseDockerfile reads the common subset of a Dockerfile into a Template:
//
//   - FROM image (one stage; ARGs before FROM may set the image)
//   - RUN, shell form or exec form (which becomes a shell command that
//     runs exactly that argv)
//   - COPY and ADD of files from the uploaded context, with --chown and an
//     octal --chmod; one COPY step per source. ADD of a URL, a git
//     repository or an archive (which ADD would unpack) is refused.
//   - ENV (name=value ... and the old "name value"), ARG with defaults
//   - WORKDIR, USER
//   - CMD and ENTRYPOINT, which make the start command
//   - EXPOSE, LABEL and MAINTAINER, which change nothing a template keeps,
//     are read and ignored
//
// with line continuations, comments, the escape directive, and variable
// substitution ($VAR, ${VAR}, ${VAR:-default}, ${VAR:+alt}, ...) where the
// Dockerfile reference has it: in FROM, COPY/ADD, ENV, ARG, WORKDIR and
// USER, never in RUN, CMD or ENTRYPOINT (the shell expands those when the
// step runs, with the ENV and ARG values in its environment).
//
// Anything else is refused with errdefs.ErrInvalid naming the line and the
// instruction: a second FROM or FROM ... AS (multi-stage builds), heredocs,
// RUN --mount and other flags, COPY --from, HEALTHCHECK, ONBUILD, SHELL,
// STOPSIGNAL, VOLUME, unknown instructions. A Dockerfile over
// Limits.DockerfileBytes is errdefs.ErrTooLarge.
//
// COPY steps have no FilesHash: the runner fills it in from the uploaded
// context before it computes cache keys.
func ParseDockerfile(dockerfile []byte, opts ParseOptions) (*Template, error) {
	lim := opts.Limits.orDefaults()
	if len(dockerfile) > lim.DockerfileBytes {
		return nil, errdefs.Newf(errdefs.ErrTooLarge, "the Dockerfile is %d bytes, the limit is %d", len(dockerfile), lim.DockerfileBytes)
	}
	if err := checkLines(dockerfile, lim.LineBytes); err != nil {
		return nil, err
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, parseErr(err)
	}
	p := &dfParser{
		lim:     lim,
		opts:    opts,
		lex:     shell.NewLex(res.EscapeToken),
		globals: newVars(),
		env:     newVars(),
		args:    newVars(),
	}
	for name, v := range opts.BaseEnv {
		p.env.set(name, v)
	}
	for _, n := range res.AST.Children {
		if err := p.instruction(n); err != nil {
			//lint:ignore ST1005 "Dockerfile" is a name, and the message is shown as it is
			return nil, fmt.Errorf("Dockerfile line %d: %s: %w", n.StartLine, strings.ToUpper(n.Value), err)
		}
	}
	if !p.sawFrom {
		return nil, errdefs.New(errdefs.ErrInvalid, "the Dockerfile has no FROM")
	}
	p.t.StartCmd = p.startCmd()
	if err := p.t.validate(lim); err != nil {
		return nil, err
	}
	return &p.t, nil
}

// checkLines refuses a physical line over max bytes before the parser
// holds it, and NUL anywhere (no Dockerfile has one; no exec can pass one).
func checkLines(b []byte, max int) error {
	line := 1
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		cur := b
		if i >= 0 {
			cur, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(cur) > max {
			return errdefs.Newf(errdefs.ErrInvalid, "Dockerfile line %d is %d bytes, the limit is %d", line, len(cur), max)
		}
		if bytes.IndexByte(cur, 0) >= 0 {
			return errdefs.Newf(errdefs.ErrInvalid, "Dockerfile line %d contains NUL", line)
		}
		line++
	}
	return nil
}

// parseErr explains the parser's own refusal with its line.
func parseErr(err error) error {
	msg := err.Error()
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		msg = fmt.Sprintf("line %d: %s", le.Locations[0][0].Start.Line, msg)
	}
	if len(msg) > 256 {
		msg = msg[:256] + "…"
	}
	return errdefs.Wrap(errdefs.ErrInvalid, err, "the Dockerfile cannot be parsed: "+msg)
}

// dfParser is one ParseDockerfile's state, instruction to instruction.
type dfParser struct {
	lim  Limits
	opts ParseOptions
	lex  *shell.Lex
	t    Template

	sawFrom bool
	globals *vars // ARGs before FROM: only FROM, and a later ARG of the same name, see them
	env     *vars // the base's environment and ENV so far
	args    *vars // ARGs after FROM that have a value
	envUsed envBudget

	cmd, entrypoint *command
}

// command is a CMD or ENTRYPOINT: exec form (argv) or shell form (text).
type command struct {
	exec bool
	argv []string
	text string
}

// Instructions read and ignored: they change nothing a template keeps.
var ignored = map[string]bool{"expose": true, "label": true, "maintainer": true}

// Instructions a Dockerfile may have that a template does not take, with why.
var unsupported = map[string]string{
	"healthcheck": "a template's readiness is its ready command",
	"onbuild":     "templates are not built FROM in other Dockerfiles",
	"shell":       "steps run with the build's /bin/sh",
	"stopsignal":  "a template keeps no stop signal",
	"volume":      "a template has no volumes; remove it or use a directory",
}

func (p *dfParser) instruction(n *parser.Node) error {
	name := strings.ToLower(n.Value)
	if len(n.Heredocs) > 0 {
		return errdefs.New(errdefs.ErrInvalid, "heredocs (<<EOF) are not supported; put the text in a file and COPY it, or use printf in RUN")
	}
	if !p.sawFrom && name != "from" && name != "arg" {
		return errdefs.New(errdefs.ErrInvalid, "only ARG may come before FROM")
	}
	switch name {
	case "from":
		return p.from(n)
	case "arg":
		return p.arg(n)
	case "run":
		return p.run(n)
	case "copy", "add":
		return p.copy(n, name == "add")
	case "env":
		return p.envInstr(n)
	case "workdir":
		return p.workdir(n)
	case "user":
		return p.user(n)
	case "cmd", "entrypoint":
		return p.startInstr(n, name)
	}
	if ignored[name] {
		return nil
	}
	if why, ok := unsupported[name]; ok {
		return errdefs.Newf(errdefs.ErrInvalid, "%s is not supported: %s", strings.ToUpper(name), why)
	}
	return errdefs.Newf(errdefs.ErrInvalid, "unknown instruction %q", clip(n.Value))
}

func (p *dfParser) noFlags(n *parser.Node) error {
	if len(n.Flags) > 0 {
		return errdefs.Newf(errdefs.ErrInvalid, "flag %s is not supported", clip(n.Flags[0]))
	}
	return nil
}

func (p *dfParser) addStep(s Step, n *parser.Node) error {
	if len(p.t.Steps) >= p.lim.Steps {
		return errdefs.Newf(errdefs.ErrInvalid, "the Dockerfile makes more than %d steps", p.lim.Steps)
	}
	s.Line = n.StartLine
	if err := s.validate(p.lim, &p.envUsed); err != nil {
		return err
	}
	p.t.Steps = append(p.t.Steps, s)
	return nil
}

func words(n *parser.Node) []string {
	var out []string
	for w := n.Next; w != nil; w = w.Next {
		out = append(out, w.Value)
	}
	return out
}

func (p *dfParser) from(n *parser.Node) error {
	if p.sawFrom {
		return errdefs.New(errdefs.ErrInvalid, "a second FROM: multi-stage builds are not supported")
	}
	p.sawFrom = true
	if err := p.noFlags(n); err != nil {
		return err
	}
	w := words(n)
	switch {
	case len(w) == 3 && strings.EqualFold(w[1], "as"):
		return errdefs.New(errdefs.ErrInvalid, "FROM ... AS: multi-stage builds are not supported")
	case len(w) != 1:
		return errdefs.New(errdefs.ErrInvalid, "FROM takes one image")
	}
	image, err := p.expand(w[0], p.globals, p.lim.FieldBytes)
	if err != nil {
		return err
	}
	switch {
	case image == "":
		return errdefs.New(errdefs.ErrInvalid, "the image is empty after substitution")
	case image == "scratch":
		return errdefs.New(errdefs.ErrInvalid, "FROM scratch is not supported: the steps need a base with a shell")
	}
	p.t.Base = Base{Kind: BaseImage, Ref: image}
	return p.t.Base.validate(p.lim)
}

func (p *dfParser) arg(n *parser.Node) error {
	if err := p.noFlags(n); err != nil {
		return err
	}
	w := words(n)
	if len(w) == 0 {
		return errdefs.New(errdefs.ErrInvalid, "ARG needs a name")
	}
	var set []EnvVar
	for _, word := range w {
		name, def, hasDef := strings.Cut(word, "=")
		if name == "" {
			return errdefs.Newf(errdefs.ErrInvalid, "%q has no name", clip(word))
		}
		value, has := p.opts.BuildArgs[name]
		if !has && hasDef {
			scope := p.globals
			if p.sawFrom {
				scope = p.scope()
			}
			v, err := p.expand(def, scope, p.lim.EnvValueBytes)
			if err != nil {
				return err
			}
			value, has = v, true
		}
		if !p.sawFrom {
			if has {
				p.globals.set(name, value)
			}
			continue
		}
		if !has {
			// A global ARG redeclared in the stage takes its value.
			value, has = p.globals.get(name)
		}
		if has {
			p.args.set(name, value)
			set = append(set, EnvVar{Name: name, Value: value})
		}
	}
	if len(set) == 0 {
		return nil
	}
	return p.addStep(Step{Kind: StepArg, Env: set}, n)
}

func (p *dfParser) run(n *parser.Node) error {
	if err := p.noFlags(n); err != nil {
		return err
	}
	var cmd string
	if n.Attributes["json"] {
		cmd = shellJoin(words(n))
	} else if n.Next != nil {
		cmd = n.Next.Value
	}
	if strings.TrimSpace(cmd) == "" {
		return errdefs.New(errdefs.ErrInvalid, "RUN needs a command")
	}
	return p.addStep(Step{Kind: StepRun, Command: cmd}, n)
}

// archive is how ADD recognises a file it would unpack.
var archive = regexp.MustCompile(`(?i)\.(tar|tgz|tbz2?|txz|tzst|tar\.(gz|bz2|xz|zst|lz4|z))$`)

func (p *dfParser) copy(n *parser.Node, isAdd bool) error {
	var user string
	var mode fs.FileMode
	for _, f := range n.Flags {
		key, val, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch key {
		case "chown":
			u, err := p.expand(val, p.scope(), p.lim.FieldBytes)
			if err != nil {
				return err
			}
			user = u
		case "chmod":
			m, err := strconv.ParseUint(val, 8, 32)
			if err != nil || m > 0o7777 {
				return errdefs.Newf(errdefs.ErrInvalid, "--chmod=%s: only an octal mode such as 0755 is supported", clip(val))
			}
			mode = fs.FileMode(m)
		case "link":
			// Only how Docker stores the layer; the files are the same.
		case "from":
			return errdefs.New(errdefs.ErrInvalid, "--from: multi-stage builds are not supported")
		default:
			return errdefs.Newf(errdefs.ErrInvalid, "flag %s is not supported", clip(f))
		}
	}
	w := words(n)
	if len(w) < 2 {
		return errdefs.New(errdefs.ErrInvalid, "needs a source and a destination")
	}
	var expanded []string
	for _, word := range w {
		v, err := p.expand(word, p.scope(), p.lim.FieldBytes)
		if err != nil {
			return err
		}
		expanded = append(expanded, v)
	}
	srcs, dest := expanded[:len(expanded)-1], expanded[len(expanded)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return errdefs.Newf(errdefs.ErrInvalid, "with more than one source the destination %q must be a directory ending in /", clip(dest))
	}
	for _, src := range srcs {
		if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
			return errdefs.Newf(errdefs.ErrInvalid, "source %q: only files from the uploaded context can be copied, not URLs; download them in a RUN step", clip(src))
		}
		if isAdd && archive.MatchString(src) {
			return errdefs.Newf(errdefs.ErrInvalid, "ADD %q would unpack the archive, which is not supported: COPY it and unpack it in a RUN step", clip(src))
		}
		// Docker reads a source from the context's root, with or without "/".
		rel := strings.TrimLeft(src, "/")
		if rel == "" {
			rel = "."
		}
		if err := p.addStep(Step{Kind: StepCopy, Src: path.Clean(rel), Dest: dest, User: user, Mode: mode}, n); err != nil {
			return err
		}
	}
	return nil
}

func (p *dfParser) envInstr(n *parser.Node) error {
	if err := p.noFlags(n); err != nil {
		return err
	}
	// The node is name, value, separator, name, value, separator...; every
	// value is expanded with the variables from before this instruction
	// (ENV a=1 b=$a takes a from before, per the Dockerfile reference).
	scope := p.scope()
	var set []EnvVar
	for k := n.Next; k != nil; {
		v := k.Next
		if v == nil {
			return errdefs.Newf(errdefs.ErrInvalid, "%q has no value", clip(k.Value))
		}
		name, err := p.expand(k.Value, scope, p.lim.FieldBytes)
		if err != nil {
			return err
		}
		value, err := p.expand(v.Value, scope, p.lim.EnvValueBytes)
		if err != nil {
			return err
		}
		set = append(set, EnvVar{Name: name, Value: value})
		k = v.Next
		if k != nil {
			k = k.Next // past the separator
		}
	}
	if len(set) == 0 {
		return errdefs.New(errdefs.ErrInvalid, "ENV needs name=value")
	}
	if err := p.addStep(Step{Kind: StepEnv, Env: set}, n); err != nil {
		return err
	}
	for _, e := range set {
		p.env.set(e.Name, e.Value)
	}
	return nil
}

func (p *dfParser) oneWord(n *parser.Node, what string) (string, error) {
	if err := p.noFlags(n); err != nil {
		return "", err
	}
	if n.Next == nil || strings.TrimSpace(n.Next.Value) == "" {
		return "", errdefs.Newf(errdefs.ErrInvalid, "needs %s", what)
	}
	return p.expand(n.Next.Value, p.scope(), p.lim.FieldBytes)
}

func (p *dfParser) workdir(n *parser.Node) error {
	dir, err := p.oneWord(n, "a directory")
	if err != nil {
		return err
	}
	return p.addStep(Step{Kind: StepWorkdir, Path: dir}, n)
}

func (p *dfParser) user(n *parser.Node) error {
	u, err := p.oneWord(n, "a user")
	if err != nil {
		return err
	}
	return p.addStep(Step{Kind: StepUser, User: u}, n)
}

func (p *dfParser) startInstr(n *parser.Node, name string) error {
	if err := p.noFlags(n); err != nil {
		return err
	}
	c := &command{exec: n.Attributes["json"]}
	if c.exec {
		c.argv = words(n)
	} else if n.Next != nil {
		c.text = n.Next.Value
	}
	if err := checkText(name, c.text+strings.Join(c.argv, " "), p.lim.CommandBytes); err != nil {
		return err
	}
	if name == "cmd" {
		p.cmd = c
	} else {
		p.entrypoint = c
	}
	return nil
}

// startCmd combines ENTRYPOINT and CMD as Docker does, into one shell
// command: a shell-form ENTRYPOINT ignores CMD; an exec-form one takes CMD
// as its arguments (a shell-form CMD through /bin/sh -c).
func (p *dfParser) startCmd() string {
	e, c := p.entrypoint, p.cmd
	switch {
	case e == nil && c == nil:
		return ""
	case e == nil:
		return c.shell()
	case !e.exec:
		return e.text
	case c == nil:
		return shellJoin(e.argv)
	case c.exec:
		return shellJoin(append(append([]string{}, e.argv...), c.argv...))
	default:
		return shellJoin(append(append([]string{}, e.argv...), "/bin/sh", "-c", c.text))
	}
}

func (c *command) shell() string {
	if c.exec {
		return shellJoin(c.argv)
	}
	return c.text
}

// scope is what a word after FROM is expanded with: ENV (the base's and
// the Dockerfile's) over the stage's ARGs, as in Docker.
func (p *dfParser) scope() *vars { return p.args.overlay(p.env) }

// dollarName finds the variables a word may refer to, to bound what
// substituting them can make before doing it; a "/" right after "${name"
// is a pattern replacement.
var dollarName = regexp.MustCompile(`\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(/)?`)

// expand substitutes variables in word, refusing a result over max bytes
// without building it: "ENV A=$A$A" doubles, and "${A//?/long text}"
// multiplies, and so would memory.
func (p *dfParser) expand(word string, scope *vars, max int) (string, error) {
	bound := len(word)
	for _, m := range dollarName.FindAllStringSubmatch(word, -1) {
		v, _ := scope.get(m[2])
		if m[1] == "{" && m[3] == "/" {
			// Every character of v may be replaced by up to the whole word.
			bound += len(v) * (1 + len(word))
			continue
		}
		bound += len(v)
	}
	if bound > 4*max {
		return "", errdefs.Newf(errdefs.ErrInvalid, "substituting variables in %q would make more than %d bytes", clip(word), max)
	}
	out, _, err := p.lex.ProcessWord(word, scope)
	if err != nil {
		return "", errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("cannot substitute variables in %q: %s", clip(word), clip(err.Error())))
	}
	if len(out) > max {
		return "", errdefs.Newf(errdefs.ErrInvalid, "%q is %d bytes after substitution, the limit is %d", clip(word), len(out), max)
	}
	return out, nil
}

// vars is a set of variables for shell.Lex (its EnvGetter).
type vars struct {
	m    map[string]string
	keys []string
	next *vars // looked up when m lacks a name
}

func newVars() *vars { return &vars{m: map[string]string{}} }

func (v *vars) set(name, value string) {
	if _, ok := v.m[name]; !ok {
		v.keys = append(v.keys, name)
	}
	v.m[name] = value
}

// overlay is a view of v with top's names over it; both stay live.
func (v *vars) overlay(top *vars) *vars {
	return &vars{m: top.m, keys: top.keys, next: v}
}

func (v *vars) get(name string) (string, bool) {
	for s := v; s != nil; s = s.next {
		if val, ok := s.m[name]; ok {
			return val, true
		}
	}
	return "", false
}

// Get is shell.EnvGetter's.
func (v *vars) Get(name string) (string, bool) { return v.get(name) }

// Keys is shell.EnvGetter's.
func (v *vars) Keys() []string {
	var out []string
	for s := v; s != nil; s = s.next {
		out = append(out, s.keys...)
	}
	return out
}

// shellJoin quotes argv for /bin/sh so that it runs exactly that argv.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("_@%+=:,./-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
