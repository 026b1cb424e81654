package mcpserver

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The account's repository files are resources:
// sandboxd://files/<account id>/<path>. resources/list lists the key's own
// account's files (main); resources/read reads any account's the key may
// act for, so an organization key can read its members' files too.

const fileTemplate = "sandboxd://files/{account_id}/{+path}"

// resourcePage is how many files one resources/list page holds.
const resourcePage = 500

func (h *Handler) addResources(srv *mcp.Server) {
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "repository-file",
		Title:       "A file of an account's repository",
		Description: "A file of main of the account's repository, read through submodules.",
		URITemplate: fileTemplate,
	}, h.readResource)
	// The list depends on who asks, which the SDK's static list cannot
	// express: answer resources/list here.
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if lr, ok := req.(*mcp.ListResourcesRequest); ok && method == "resources/list" {
				return h.listResources(ctx, lr)
			}
			return next(ctx, method, req)
		}
	})
}

// fileURI is the resource URI of a file of account's repository.
func fileURI(account, p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "sandboxd://files/" + account + "/" + strings.Join(segs, "/")
}

// parseFileURI splits a file URI into its account and path.
func parseFileURI(uri string) (account, p string, ok bool) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "sandboxd" || u.Host != "files" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", false
	}
	account, p, ok = strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	return account, p, ok && p != ""
}

func (h *Handler) listResources(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	who, ok := caller(ctx)
	if !ok {
		return nil, errors.New("unauthenticated")
	}
	start := 0
	if req.Params != nil && req.Params.Cursor != "" {
		n, err := strconv.Atoi(req.Params.Cursor)
		if err != nil || n < 0 {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor"}
		}
		start = n
	}
	res := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	url, err := h.opts.Files.RepoURL(ctx, who.AccountID)
	if err != nil {
		return nil, h.resourceError(ctx, err)
	}
	if url == "" {
		return res, nil
	}
	tree, _, err := h.tree(ctx, who.AccountID)
	if err != nil {
		return nil, h.resourceError(ctx, err)
	}
	i := 0
	for _, e := range tree {
		if e.Type != "blob" {
			continue
		}
		if i >= start {
			if len(res.Resources) == resourcePage {
				res.NextCursor = strconv.Itoa(i)
				break
			}
			r := &mcp.Resource{URI: fileURI(who.AccountID, e.Path), Name: e.Path, MIMEType: mimeType(e.Path, false)}
			if e.Size != nil {
				r.Size = *e.Size
			}
			res.Resources = append(res.Resources, r)
		}
		i++
	}
	return res, nil
}

func (h *Handler) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	who, ok := caller(ctx)
	if !ok {
		return nil, errors.New("unauthenticated")
	}
	account, file, ok := parseFileURI(uri)
	if !ok || !auth.IsUUID(account) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	// Another account's files are "not found", like its ids elsewhere.
	if _, err := h.opts.Gate.Account(ctx, who, account); err != nil {
		if errors.Is(err, auth.ErrForbidden) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, h.resourceError(ctx, err)
	}
	account = strings.ToLower(account)
	data, err := h.opts.Files.Read(ctx, account, file)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrNoRepository) || errors.Is(err, store.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, h.resourceError(ctx, err)
	}
	binary := contract.IsBinary(file, data)
	c := &mcp.ResourceContents{URI: uri, MIMEType: mimeType(file, binary)}
	if binary {
		c.Blob = data
	} else {
		c.Text = string(data)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}

// resourceError is a JSON-RPC error with the API's message for err, or an
// internal error that leaks nothing (and is logged).
func (h *Handler) resourceError(ctx context.Context, err error) error {
	e, internal := edge.Explain(err, "Not found")
	if internal {
		h.log.ErrorContext(ctx, "mcp resource failed", "err", err)
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: e.Msg}
	}
	code := int64(jsonrpc.CodeInvalidParams)
	if e.Status >= 500 {
		code = jsonrpc.CodeInternalError
	}
	return &jsonrpc.Error{Code: code, Message: e.Msg}
}
