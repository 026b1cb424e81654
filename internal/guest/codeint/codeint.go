// Package codeint is the code interpreter of a sandbox's guest agent:
// stateful Jupyter kernels (contexts) that run code as the sandbox's user
// and answer with every representation the kernel gives, served in the
// protocol of E2B's code-interpreter server (docs/CODE.md), which the
// host's front ends forward to or translate.
//
// The kernels are driven by a small Python program (shim.py) on
// jupyter_client, one per user, that the agent starts on first use and
// talks newline-delimited JSON with over pipes. Kernels listen on Unix
// sockets in a private directory: no port is opened in the sandbox, so
// nothing but this package reaches them, and a sandbox with kernels can be
// paused. What a kernel sends is bounded in the sandbox by the shim and
// again here (maxEventLine); an execution's output is streamed, never held.
//
// Invariants: one execution at a time per context (others wait their
// turn); an execution whose caller goes away, or whose timeout runs out,
// interrupts its kernel and is drained, so the context stays usable; a
// context belongs to the user that made it and is invisible to others.
package codeint

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Process is a started shim: the agent starts it as the user, in its own
// session, and reaps it.
type Process struct {
	Stdin  io.WriteCloser
	Stdout io.ReadCloser
	// Kill ends the process and everything in its session.
	Kill func()
}

// Caller is who an HTTP request of the interpreter acts as, resolved by
// the agent: the user, the environment a context's kernel starts with
// (the sandbox's, the user's and the host's) and the directory a context
// starts in when the request names none.
type Caller struct {
	User string
	Env  []string
	Dir  string
}

// Launcher starts the shim for c: python3 with argv, as c.User, with env.
type Launcher func(c Caller, argv, env []string) (*Process, error)

// Interpreter holds a sandbox's contexts and the shims that run them.
type Interpreter struct {
	launch Launcher
	log    *slog.Logger
	// kernelDirs are where kernelspecs are looked for, after the user's
	// own (~/.local/share/jupyter/kernels).
	kernelDirs []string

	mu       sync.Mutex
	shims    map[string]*shim    // by user
	contexts map[string]*Context // by id
	// defaults are the default context of each user and language
	// (user+"\x00"+language → id), made on first use.
	defaults map[string]string
	// making serializes the making of one user's default context of one
	// language, so two first executions share one kernel.
	making map[string]*sync.Mutex
	made   uint64 // contexts made so far
}

// DefaultKernelDirs are the system's kernelspec directories (Jupyter's
// data path without a virtualenv).
var DefaultKernelDirs = []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"}

// New returns an Interpreter that starts shims with launch.
func New(launch Launcher, log *slog.Logger, kernelDirs []string) *Interpreter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if kernelDirs == nil {
		kernelDirs = DefaultKernelDirs
	}
	return &Interpreter{launch: launch, log: log, kernelDirs: kernelDirs, shims: map[string]*shim{},
		contexts: map[string]*Context{}, defaults: map[string]string{}, making: map[string]*sync.Mutex{}}
}

// Context is one kernel: its id, language and directory, as E2B's SDKs
// see it.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	user string
	seq  uint64 // the order contexts were made in
	sh   *shim
	// turn is held by the running execution (a one-slot semaphore).
	turn chan struct{}
}

// Closing all shims ends their kernels; the interpreter stays usable.
func (in *Interpreter) Close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for u, s := range in.shims {
		s.close()
		delete(in.shims, u)
	}
	clear(in.contexts)
	clear(in.defaults)
}

// Errors a request is answered with by kind (http.go maps them).
var (
	errNotFound = errors.New("not found")
	errInvalid  = errors.New("invalid")
)

// normalizeLanguage is E2B's: empty is python, case and spaces do not
// matter, js and ts are javascript and typescript.
func normalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

// kernelspec is what is read of one installed kernel.
type kernelspec struct {
	Name     string
	Language string `json:"language"`
}

// kernels lists the kernelspecs installed for c: the user's own first
// (the first of a name wins, as in Jupyter), then the system's.
func (in *Interpreter) kernels(c Caller) []kernelspec {
	dirs := slices.Clone(in.kernelDirs)
	if home := envValue(c.Env, "HOME"); home != "" {
		dirs = append([]string{filepath.Join(home, ".local/share/jupyter/kernels")}, dirs...)
	}
	seen := map[string]bool{}
	var out []kernelspec
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if seen[e.Name()] {
				continue
			}
			b, err := readSmall(filepath.Join(d, e.Name(), "kernel.json"), 64<<10)
			if err != nil {
				continue
			}
			var ks kernelspec
			if json.Unmarshal(b, &ks) != nil {
				continue
			}
			seen[e.Name()] = true
			ks.Name, ks.Language = e.Name(), strings.ToLower(ks.Language)
			out = append(out, ks)
		}
	}
	return out
}

// kernelFor picks the kernel of language: the kernelspec of that name,
// else one whose language it is (python3 for python, tslab for
// typescript); a typescript request takes a javascript kernel when there
// is no typescript one, as E2B's does.
func (in *Interpreter) kernelFor(c Caller, language string) (string, error) {
	specs := in.kernels(c)
	for _, want := range []string{language, fallbackLanguage(language)} {
		if want == "" {
			continue
		}
		for _, ks := range specs {
			if ks.Name == want {
				return ks.Name, nil
			}
		}
		for _, ks := range specs {
			if ks.Language == want {
				return ks.Name, nil
			}
		}
	}
	var have []string
	for _, ks := range specs {
		have = append(have, ks.Language)
	}
	slices.Sort(have)
	if len(have) == 0 {
		return "", fmt.Errorf("%w: this sandbox has no Jupyter kernel installed: start it from a template with one (the built-in code-interpreter, or an image with python3-ipykernel)", errInvalid)
	}
	return "", fmt.Errorf("%w: no kernel for language %q in this sandbox (it has %s)", errInvalid, language, strings.Join(slices.Compact(have), ", "))
}

func fallbackLanguage(l string) string {
	if l == "typescript" {
		return "javascript"
	}
	return ""
}

// shimFor is c's shim, started when there is none (or it exited).
func (in *Interpreter) shimFor(c Caller) (*shim, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s := in.shims[c.User]; s != nil && s.alive() {
		return s, nil
	}
	// A shim that exited took its kernels: their contexts go too.
	for id, ctx := range in.contexts {
		if ctx.user == c.User {
			in.dropLocked(id)
		}
	}
	p, err := in.launch(c, []string{"python3", "-c", shimSource}, c.Env)
	if err != nil {
		return nil, fmt.Errorf("start the code interpreter: %w", err)
	}
	s := newShim(p)
	in.shims[c.User] = s
	return s, nil
}

// dropLocked forgets context id (in.mu held).
func (in *Interpreter) dropLocked(id string) {
	ctx := in.contexts[id]
	delete(in.contexts, id)
	if ctx == nil {
		return
	}
	for k, v := range in.defaults {
		if v == id {
			delete(in.defaults, k)
		}
	}
}

// Create starts a new context of language in cwd (c.Dir when empty).
func (in *Interpreter) Create(ctx context.Context, c Caller, language, cwd string) (*Context, error) {
	language = normalizeLanguage(language)
	if cwd == "" {
		cwd = c.Dir
	}
	if !filepath.IsAbs(cwd) {
		return nil, fmt.Errorf("%w: cwd %q: an absolute path", errInvalid, cwd)
	}
	kernel, err := in.kernelFor(c, language)
	if err != nil {
		return nil, err
	}
	s, err := in.shimFor(c)
	if err != nil {
		return nil, err
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	ch, err := s.call(request{Op: "start", Ctx: id, Kernel: kernel, Cwd: cwd, Env: envMap(c.Env)}, true)
	if err != nil {
		return nil, err
	}
	// A kernel takes seconds to start; the caller going away does not
	// stop it (the context is then made and listed, as in E2B).
	var last event
	for e := range ch {
		last = e
	}
	switch last.Ev {
	case "started":
	case "failed":
		return nil, fmt.Errorf("start a %s kernel: %s", kernel, last.Message)
	default:
		return nil, fmt.Errorf("start a %s kernel: %w", kernel, s.err)
	}
	cx := &Context{ID: id, Language: language, Cwd: cwd, user: c.User, sh: s, turn: make(chan struct{}, 1)}
	in.mu.Lock()
	in.made++
	cx.seq = in.made
	in.contexts[id] = cx
	in.mu.Unlock()
	return cx, nil
}

// Default is c's default context of language, made on first use.
func (in *Interpreter) Default(ctx context.Context, c Caller, language string) (*Context, error) {
	language = normalizeLanguage(language)
	key := c.User + "\x00" + language
	if cx := in.defaultOf(key); cx != nil {
		return cx, nil // the common case: no lock of its own, no I/O
	}
	in.mu.Lock()
	m := in.making[key]
	in.mu.Unlock()
	if m == nil {
		// Only a language the sandbox has gets a lock of its own.
		if _, err := in.kernelFor(c, language); err != nil {
			return nil, err
		}
		in.mu.Lock()
		if m = in.making[key]; m == nil {
			m = &sync.Mutex{}
			in.making[key] = m
		}
		in.mu.Unlock()
	}
	m.Lock()
	defer m.Unlock()
	if cx := in.defaultOf(key); cx != nil {
		return cx, nil // made while this call waited
	}
	cx, err := in.Create(ctx, c, language, "")
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.defaults[key] = cx.ID
	in.mu.Unlock()
	return cx, nil
}

// defaultOf is the live default context of key (user and language), or
// nil.
func (in *Interpreter) defaultOf(key string) *Context {
	in.mu.Lock()
	defer in.mu.Unlock()
	if cx := in.contexts[in.defaults[key]]; cx != nil && cx.sh.alive() {
		return cx
	}
	return nil
}

// Get is c's context id.
func (in *Interpreter) Get(c Caller, id string) (*Context, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	cx := in.contexts[id]
	if cx == nil || cx.user != c.User || !cx.sh.alive() {
		return nil, fmt.Errorf("%w: Context %s not found", errNotFound, id)
	}
	return cx, nil
}

// List is c's contexts, the oldest first.
func (in *Interpreter) List(c Caller) []*Context {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []*Context
	for _, cx := range in.contexts {
		if cx.user == c.User && cx.sh.alive() {
			out = append(out, cx)
		}
	}
	slices.SortFunc(out, func(a, b *Context) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// Restart starts context id's kernel anew: same id, language and
// directory, no state. A running execution ends with ContextRestarting.
func (in *Interpreter) Restart(c Caller, id string) error {
	cx, err := in.Get(c, id)
	if err != nil {
		return err
	}
	ch, err := cx.sh.call(request{Op: "restart", Ctx: id}, true)
	if err != nil {
		return err
	}
	var last event
	for e := range ch {
		last = e
	}
	if last.Ev != "restarted" {
		return fmt.Errorf("restart context %s: %s", id, orUnknown(last.Message, cx.sh.err))
	}
	return nil
}

// Remove stops context id's kernel and forgets it. A running execution
// ends with ContextRemoved.
func (in *Interpreter) Remove(c Caller, id string) error {
	cx, err := in.Get(c, id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	in.dropLocked(id)
	in.mu.Unlock()
	ch, err := cx.sh.call(request{Op: "shutdown", Ctx: id}, true)
	if err != nil {
		return nil // the shim is gone, and the kernel with it
	}
	for range ch {
	}
	return nil
}

func orUnknown(msg string, err error) string {
	switch {
	case msg != "":
		return msg
	case err != nil:
		return err.Error()
	}
	return "no answer"
}

func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func envValue(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

func readSmall(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}
