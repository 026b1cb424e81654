// Package mcpserver serves sandboxd to AI assistants and IDE agents over the
// Model Context Protocol: the Streamable HTTP transport at /mcp, with tools
// that run prompts and commands in sandboxes, read and write the account's
// repository, follow runs and stop sandboxes, build and manage the
// account's templates and volumes, and the repository's files as
// resources.
//
// It is a peer of the REST API over the same services (SandboxService,
// FileService, TemplateService, VolumeService, the store's runs): every
// tool calls them directly, speaks the REST contract (internal/contract:
// its arguments are checked with the routes' own rules and messages, its
// answers are the routes' views), and asks the edge (internal/edge) who
// calls, whether the caller may see a sandbox, and what a failure is
// told. A sandbox's own key keeps its scope: it may use the reading tools
// only. In a cluster, what needs the node that hosts a sandbox is sent
// there as the API request it stands for (see cluster.go), so every node
// serves every tool.
//
// The transport is stateless: every HTTP request is authenticated on its
// own and carries its principal in its context, so a session can never be
// taken over with another key, and the server keeps nothing per client
// between requests. Progress notifications of a long tool call travel on
// that call's own response stream.
package mcpserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Path is where sandboxd serves the MCP endpoint.
const Path = "/mcp"

// Store is what the tools read from the database directly.
type Store interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	GetRun(ctx context.Context, id string) (store.Run, error)
	ListRuns(ctx context.Context, accountID string, limit int) ([]store.Run, error)
}

// Options configure the MCP server.
type Options struct {
	Store Store
	// Gate authenticates callers (cluster-forwarded ones too), checks
	// their access to a sandbox, and has the work of a sandbox another
	// node hosts done there and new sandboxes placed as the API does.
	Gate      *edge.Gate
	Sandboxes SandboxService
	Files     FileService
	// Code reaches sandboxes' code interpreters (run_code); nil: the
	// tool answers that this server has none.
	Code CodeService
	// Templates builds and keeps the accounts' templates; nil: no
	// template tools are offered.
	Templates TemplateService
	// Events lists lifecycle events (list_events); nil: no such tool.
	Events EventService
	// Volumes keeps the accounts' volumes (create_volume and the other
	// volume tools); nil: no volume tools are offered.
	Volumes VolumeService
	Logger  *slog.Logger
	Version string
	// PollInterval is how often a waiting tool looks at its run and sends
	// a progress notification (default 500ms).
	PollInterval time.Duration
	// MaxRequestBytes bounds one request's body, write_file's content
	// included (default 4 MiB, the SDK's). A larger one is answered 413
	// with a JSON-RPC error (see bufferBody).
	MaxRequestBytes int64
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Handler is the MCP endpoint; mount it at Path.
type Handler struct {
	opts      Options
	log       *slog.Logger
	transport http.Handler
}

type (
	callerKey     struct{}
	requestCtxKey struct{}
)

// New builds the MCP endpoint.
func New(opts Options) (*Handler, error) {
	if opts.Store == nil || opts.Gate == nil || opts.Sandboxes == nil || opts.Files == nil {
		return nil, errors.New("mcpserver: a store, a gate, a sandbox service and a file service are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 500 * time.Millisecond
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = mcp.DefaultMaxRequestBodyBytes
	}
	h := &Handler{opts: opts, log: opts.Logger}
	// The SDK logs every request's session at Info; the API's access log
	// already has each request, so only its warnings and errors are kept.
	sdkLog := slog.New(warnOnly{opts.Logger.Handler()})
	srv := mcp.NewServer(&mcp.Implementation{Name: "sandboxd", Title: "sandboxd", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLog,
		// No logging capability: nothing is sent but tool results and
		// progress.
		Capabilities: &mcp.ServerCapabilities{},
	})
	h.addTools(srv)
	h.addResources(srv)
	h.transport = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		Logger:                       sdkLog,
		MaxRequestBodyBytes:          opts.MaxRequestBytes,
		PropagateRequestCancellation: true,
		// The protection is for servers that trust whoever reaches
		// localhost. This one trusts no request without an API key, which
		// a page rebinding its DNS does not have; and sandboxd is often
		// reached on loopback through a reverse proxy with the public Host.
		DisableLocalhostProtection: true,
	})
	return h, nil
}

const instructions = `sandboxd runs commands and prompts in ephemeral, isolated Linux sandboxes. Each account has a git repository that every sandbox starts from (/workspace) and that each run's changes are committed to.
Use prompt_sandbox to have OpenCode do a task in a sandbox, run_command to run a program (in a new sandbox, or in a running one with sandbox_id), list_files/read_file to look at the repository, write_file/upload_files to add files to it, get_run to follow a run and stop_sandbox to end a sandbox early. A template (build_template from an OCI image or a Dockerfile, then list_templates, get_template, delete_template) is an environment of the account's own that run_command's template starts a sandbox from. list_events lists the sandboxes' lifecycle events. snapshot_sandbox saves a running sandbox's files as a named snapshot that run_command's snapshot starts new sandboxes from (list_snapshots, delete_snapshot). create_volume makes a named persistent volume (list_volumes, resize_volume, fork_volume, delete_volume) that run_command's or prompt_sandbox's volumes mount into a new sandbox, where its files outlive the sandbox. Tools act for the key's own account unless account_id names another the key may act for.`

// ServeHTTP authenticates the request as the API does (edge.Gate: an API
// key as Authorization: Bearer or x-api-key, or on the cluster listener
// the key another node's signed forward names) and hands it to the MCP
// transport with its caller. A missing or bad key is answered 401 with
// the API's error body before any MCP message is read.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, err := h.opts.Gate.Authenticate(r, nil)
	if err != nil {
		if errors.Is(err, auth.ErrCredentials) || errors.Is(err, auth.ErrUnauthorized) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
		}
		e, internal := edge.Explain(err, "")
		if internal {
			h.log.ErrorContext(r.Context(), "mcp: authenticate", "err", err, "path", r.URL.Path)
		}
		contract.WriteError(w, e)
		return
	}
	if r.Method == http.MethodPost && !h.bufferBody(w, r) {
		return
	}
	ctx := context.WithValue(r.Context(), callerKey{}, c)
	ctx = context.WithValue(ctx, requestCtxKey{}, r.Context())
	h.transport.ServeHTTP(w, r.WithContext(ctx))
}

// caller is the authenticated caller of a request. The transport is
// stateless, so the session of every request is made with that request's
// context, and a handler's context carries the key that sent it.
func caller(ctx context.Context) (edge.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(edge.Caller)
	return c, ok && c.AccountID != ""
}

// boundToRequest returns ctx cancelled also when the HTTP request that
// carried the call ends (its client went away). The SDK ties a handler to
// its request only for clients of the 2026-07-28 protocol; for older ones
// a wait or an exec would go on for nobody.
func boundToRequest(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if req, ok := ctx.Value(requestCtxKey{}).(context.Context); ok {
		stop := context.AfterFunc(req, cancel)
		return ctx, func() { stop(); cancel() }
	}
	return ctx, cancel
}

// warnOnly passes on records of level Warn and above.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnOnly{w.Handler.WithAttrs(attrs)}
}

func (w warnOnly) WithGroup(name string) slog.Handler { return warnOnly{w.Handler.WithGroup(name)} }
