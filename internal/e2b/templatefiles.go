package e2b

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// The file uploads of E2B's Template API (docs/design/e2b-template-wire.md,
// "Upload the files of each copy"): for each COPY step the SDK asks
// GET /templates/{templateID}/files/{hash} whether the account has the
// files, and PUTs the archive to the url the answer carries, without its
// API key. The url is this API's own PUT route, with a link signed for
// the caller's account and that hash alone, good for an hour
// (templates.Service.SignUpload); the PUT is bounded as any upload. The
// files are the account's, whatever template the path names: one
// upload serves every build that copies the same files.

// TemplateFiles are the accounts' uploaded build files (package
// templates' Service).
type TemplateFiles interface {
	HasFiles(ctx context.Context, p auth.Principal, hash string) (templates.FilesInfo, bool, error)
	SignUpload(accountID, hash string, now time.Time) templates.UploadLink
	PutSignedFiles(ctx context.Context, hash string, l templates.UploadLink, now time.Time, r io.Reader) (templates.FilesInfo, error)
	MaxUploadBytes() int64
}

// fileUpload is E2B's TemplateBuildFileUpload.
type fileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// fileUploadLink is GET /templates/{templateID}/files/{hash}: 201 with
// whether the caller's account has the files, and the signed url to PUT
// them to (always: the SDK's forceUpload uploads files already present).
func (a *API) fileUploadLink(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	files, err := a.templateFiles()
	if err != nil {
		return err
	}
	hash := chi.URLParam(r, "hash")
	_, present, err := files.HasFiles(r.Context(), c.Principal, hash)
	if err != nil {
		return err
	}
	l := files.SignUpload(c.Principal.AccountID, hash, a.opts.Now())
	q := url.Values{"account": {l.AccountID}, "expires": {strconv.FormatInt(l.Expires, 10)}, "signature": {l.Signature}}
	u := url.URL{Scheme: requestScheme(r), Host: r.Host, Path: "/templates/" + url.PathEscape(chi.URLParam(r, "templateID")) + "/files/" + hash, RawQuery: q.Encode()}
	writeJSON(w, http.StatusCreated, fileUpload{Present: present, URL: u.String()})
	return nil
}

// uploadFiles is the PUT of a signed link: the body, a tar archive (or a
// gzipped one), stored as the account's files named hash. No API key:
// the link's signature is the authority, for its account and hash only.
func (a *API) uploadFiles(w http.ResponseWriter, r *http.Request) {
	files, err := a.templateFiles()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if max := files.MaxUploadBytes(); r.ContentLength > max {
		a.fail(w, r, edge.Errorf(http.StatusRequestEntityTooLarge, "the archive is %d bytes, the most one upload may weigh is %d", r.ContentLength, max))
		return
	}
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil {
		a.fail(w, r, edge.Errorf(http.StatusForbidden, "the upload link is not valid: ask for a new one (GET /templates/{templateID}/files/{hash})"))
		return
	}
	l := templates.UploadLink{AccountID: q.Get("account"), Expires: expires, Signature: q.Get("signature")}
	body := &uploadBody{r: r.Body, rc: http.NewResponseController(w), until: time.Now().Add(uploadTimeout)}
	if _, err := files.PutSignedFiles(r.Context(), chi.URLParam(r, "hash"), l, a.opts.Now(), body); err != nil {
		a.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// templateFiles returns the uploaded files' service, or the refusal of a
// server without one.
func (a *API) templateFiles() (TemplateFiles, error) {
	if a.opts.Files == nil {
		return nil, edge.Errorf(http.StatusNotImplemented, "this server keeps no build files")
	}
	return a.opts.Files, nil
}

// requestScheme is the scheme the client reached this server with: https
// behind TLS here or at a proxy that says so.
func requestScheme(r *http.Request) string {
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		return "https"
	}
	return "http"
}

// An upload's body may take uploadTimeout in all (the SDK's own timeout)
// and stall uploadIdle at most, so that a client that stops sending does
// not hold the connection.
const (
	uploadTimeout = time.Hour
	uploadIdle    = 30 * time.Second
)

// uploadBody moves the connection's read deadline on with each read.
type uploadBody struct {
	r     io.Reader
	rc    *http.ResponseController
	until time.Time
}

func (b *uploadBody) Read(p []byte) (int, error) {
	d := time.Now().Add(uploadIdle)
	if d.After(b.until) {
		d = b.until
	}
	// A writer that cannot set deadlines (a test's recorder) reads as it is.
	_ = b.rc.SetReadDeadline(d)
	return b.r.Read(p)
}
