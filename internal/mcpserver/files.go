package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
)

type readArgs struct {
	Path      string `json:"path" jsonschema:"Path of the file in the repository, e.g. src/main.go"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Read this account's repository; default: the key's own"`
}

type writeArgs struct {
	Path     string `json:"path" jsonschema:"Path of the file in the repository; directories are created"`
	Content  string `json:"content" jsonschema:"The file's content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64 (content is base64, for binary files)"`
	Message  string `json:"message,omitempty" jsonschema:"Commit message (default: Upload files via API)"`
	// AccountID is accepted only as the key's own account: uploads act
	// for it alone, as POST /api/sandboxes/files does.
	AccountID string `json:"account_id,omitempty" jsonschema:"Only the key's own account: uploads act for it alone, as in the API"`
}

type uploadFile struct {
	URL  string `json:"url" jsonschema:"http or https URL to download"`
	Name string `json:"name" jsonschema:"File name in the repository (no /)"`
}

type uploadArgs struct {
	Files     []uploadFile `json:"files" jsonschema:"1 to 100 files"`
	Path      string       `json:"path,omitempty" jsonschema:"Directory of the repository to put them in (default: the top)"`
	Message   string       `json:"message,omitempty" jsonschema:"Commit message (default: Upload files via API)"`
	AccountID string       `json:"account_id,omitempty" jsonschema:"Only the key's own account: uploads act for it alone, as in the API"`
}

type listArgs struct {
	Path      string `json:"path,omitempty" jsonschema:"List only under this directory"`
	AccountID string `json:"account_id,omitempty" jsonschema:"List this account's repository; default: the key's own"`
}

// maxListed bounds the entries list_files answers: a repository with a
// vendored dependency tree would otherwise flood the model's context.
const maxListed = 2000

func (h *Handler) readFile(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	p, err := c.args.RepoPath("path")
	if err != nil {
		return nil, err
	}
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	data, err := h.opts.Files.Read(ctx, account, p)
	if err != nil {
		return nil, edge.Explained(err, "File not found in repository")
	}
	resp := contract.FileResponse{Status: "success"}
	if !contract.IsBinary(p, data) {
		resp.Content = string(data)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: resp.Content}}, StructuredContent: resp}, nil
	}
	resp.Content, resp.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	mt := mimeType(p, true)
	var content mcp.Content = &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: fileURI(account, p), MIMEType: mt, Blob: data}}
	if strings.HasPrefix(mt, "image/") && mt != "image/svg+xml" {
		content = &mcp.ImageContent{Data: data, MIMEType: mt}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{content}, StructuredContent: resp}, nil
}

// uploadAccount is the account an upload acts for: the key's own, as in
// the API; an account_id naming another is refused rather than ignored,
// so that a caller does not believe it wrote to a member's repository.
func (h *Handler) uploadAccount(ctx context.Context, c *call) (string, error) {
	account, err := h.account(ctx, c)
	if err != nil {
		return "", err
	}
	if account != c.who.AccountID {
		return "", &edge.Error{Status: http.StatusForbidden, Msg: "Uploads act for the key's own account only; omit account_id", Fields: []any{"account_id"}}
	}
	return account, nil
}

func (h *Handler) writeFile(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	p, err := c.args.RepoPath("path")
	if err != nil {
		return nil, err
	}
	content, ok, err := c.args.String("content")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, contract.FieldError("content is required", "content")
	}
	data := []byte(content)
	switch enc, _, err := c.args.String("encoding"); {
	case err != nil:
		return nil, err
	case enc == "base64":
		if data, err = base64.StdEncoding.DecodeString(content); err != nil {
			return nil, contract.FieldError("content must be valid base64", "content")
		}
	case enc != "" && enc != "utf-8":
		return nil, contract.FieldError(`encoding must be "utf-8" or "base64"`, "encoding")
	}
	message, _, err := c.args.String("message")
	if err != nil {
		return nil, err
	}
	account, err := h.uploadAccount(ctx, c)
	if err != nil {
		return nil, err
	}
	mr, err := multipartUpload(path.Dir(p), path.Base(p), message, data)
	if err != nil {
		return nil, err
	}
	uploaded, failures, err := h.opts.Files.UploadMultipart(ctx, account, mr)
	return uploadResult(uploaded, failures, err)
}

// multipartUpload is the multipart body POST /api/sandboxes/files takes for
// one file: the file service's one way to commit given content (streamed
// to a spool file, capped and counted against the quota like any upload).
func multipartUpload(dir, name, message string, data []byte) (*multipart.Reader, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if dir != "." {
		if err := mw.WriteField("path", dir); err != nil {
			return nil, err
		}
	}
	if message != "" {
		if err := mw.WriteField("message", message); err != nil {
			return nil, err
		}
	}
	fw, err := mw.CreateFormFile("file", name)
	if err != nil {
		return nil, err
	}
	if _, err := fw.Write(data); err != nil {
		return nil, err
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}
	return multipart.NewReader(&body, mw.Boundary()), nil
}

func (h *Handler) uploadFiles(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	req, err := c.args.UploadFiles()
	if err != nil {
		return nil, err
	}
	account, err := h.uploadAccount(ctx, c)
	if err != nil {
		return nil, err
	}
	uploaded, failures, err := h.opts.Files.Upload(ctx, account, req.Domain())
	return uploadResult(uploaded, failures, err)
}

// uploadResult answers an upload as the API does: success with the files
// committed (and the failures of the others), or the failures.
func uploadResult(uploaded []contract.UploadedFile, failures []string, err error) (*mcp.CallToolResult, error) {
	if err != nil {
		return nil, edge.Explained(err, "Not found")
	}
	if len(uploaded) == 0 {
		return nil, &edge.Error{Status: http.StatusBadRequest, Msg: "All uploads failed: " + strings.Join(failures, "; ")}
	}
	return jsonResult(contract.UploadFilesResponse{Status: "success", Uploaded: uploaded, Errors: failures})
}

// listResult answers list_files.
type listResult struct {
	Status     string                   `json:"status"`
	Repository *string                  `json:"repository"`
	Filetree   []contract.FileTreeEntry `json:"filetree"`
	// Truncated says that only the first entries are listed.
	Truncated bool `json:"truncated,omitempty"`
}

func (h *Handler) listFiles(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	var prefix string
	if c.args.Has("path") {
		dir, _, err := c.args.String("path")
		if err != nil {
			return nil, err
		}
		if strings.Trim(dir, "/ ") != "" {
			if prefix, err = c.args.RepoPath("path"); err != nil {
				return nil, err
			}
			prefix += "/"
		}
	}
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	res := listResult{Status: "success", Filetree: []contract.FileTreeEntry{}}
	url, err := h.opts.Files.RepoURL(ctx, account)
	if err != nil {
		return nil, edge.Explained(err, "Not found")
	}
	if url == "" {
		return jsonResult(res)
	}
	res.Repository = &url
	tree, cut, err := h.tree(ctx, account)
	if err != nil {
		return nil, err
	}
	res.Truncated = cut
	for _, e := range tree {
		if !strings.HasPrefix(e.Path, prefix) {
			continue
		}
		if len(res.Filetree) == maxListed {
			res.Truncated = true
			break
		}
		res.Filetree = append(res.Filetree, e)
	}
	return jsonResult(res)
}

// tree lists main of account's repository; the one place the tools ask
// the file service for it. cut says the service stopped at its limits.
func (h *Handler) tree(ctx context.Context, account string) (entries []contract.FileTreeEntry, cut bool, err error) {
	entries, cut, err = h.opts.Files.Tree(ctx, account)
	if err != nil {
		return nil, false, edge.Explained(err, "Not found")
	}
	return entries, cut, nil
}

// mimeType guesses a file's media type from its name.
func mimeType(name string, binary bool) string {
	if mt := mime.TypeByExtension(path.Ext(name)); mt != "" {
		return mt
	}
	if binary {
		return "application/octet-stream"
	}
	return "text/plain; charset=utf-8"
}
