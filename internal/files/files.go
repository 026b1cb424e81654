// Package files is the service behind the API's file routes: the account's
// repository URL, its tree, reads of single files, and uploads — files
// downloaded from URLs (internal/fetch) or sent as multipart parts —
// committed into the repository (internal/repo).
//
// Invariants:
//   - An upload makes at most one commit per repository it touches, with
//     every file that arrived; files that did not are reported one by one as
//     "name: reason" and never abort the others. Nothing arrived, nothing is
//     committed.
//   - Downloads and parts are spooled to temporary files, bounded per file
//     (the fetcher's cap), per upload (Options.MaxUploadBytes), in
//     parallelism (Options.Concurrency), and by the repository's quota:
//     the uploads of one account in flight at once, on every node sharing
//     Options.Reservations, spool together at most the room its quota has
//     left (each reserves room as its files arrive, and is refused, 429,
//     past it). The temporary files are removed and the reservation is
//     released before Upload returns, whichever way it ends.
//   - Errors are mapped onto the api package's sentinels, so the API answers
//     with the contract's statuses; no message leaks a server path.
package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Defaults of Options.
const (
	DefaultConcurrency    = 4
	DefaultMaxUploadBytes = 1 << 30
	DefaultMessage        = "Upload files via API"
	maxFilesPerUpload     = 100
)

// Options configure a Service.
type Options struct {
	Repos   *repo.Manager
	Fetcher *fetch.Fetcher
	// PublicURL is the server's base URL as clients reach it (e.g.
	// "http://127.0.0.1:8080"); clone URLs are <PublicURL>/git/<id>.git.
	PublicURL string
	// Concurrency bounds parallel downloads of one upload (default 4).
	Concurrency int
	// MaxUploadBytes bounds the bytes of one upload, all files together
	// (default 1 GiB): they sit in temporary files until committed.
	MaxUploadBytes int64
	// TempDir holds the temporary files (default os.TempDir()); it is
	// created if missing.
	TempDir string
	// Author signs upload commits (default repo.DefaultAuthor).
	Author repo.Signature
	// Reservations hold the room of the accounts' uploads in flight
	// (default: in this Service's memory, which other nodes do not see).
	Reservations Reservations
	Logger       *slog.Logger
}

// Service serves the account's files.
type Service struct {
	opts Options
	log  *slog.Logger
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Repos == nil || opts.Fetcher == nil {
		return nil, errors.New("files: a repository manager and a fetcher are required")
	}
	opts.PublicURL = strings.TrimRight(opts.PublicURL, "/")
	if opts.PublicURL == "" {
		return nil, errors.New("files: a public URL is required")
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxUploadBytes <= 0 {
		opts.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if opts.TempDir == "" {
		opts.TempDir = os.TempDir()
	}
	if err := os.MkdirAll(opts.TempDir, 0o700); err != nil {
		return nil, fmt.Errorf("files: create temporary directory: %w", err)
	}
	if opts.Author.Name == "" || opts.Author.Email == "" {
		opts.Author = repo.DefaultAuthor
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Reservations == nil {
		opts.Reservations = newLocalReservations()
	}
	return &Service{opts: opts, log: opts.Logger}, nil
}

// CloneURL is the URL of account's repository, whether or not it exists.
func (s *Service) CloneURL(accountID string) string {
	return s.opts.PublicURL + repo.GitPathPrefix + strings.ToLower(accountID) + ".git"
}

// RepoURL is the clone URL of account's repository, or "" when it has none.
func (s *Service) RepoURL(ctx context.Context, accountID string) (string, error) {
	ok, err := s.opts.Repos.Exists(ctx, accountID)
	if err != nil {
		return "", mapErr(err)
	}
	if !ok {
		return "", nil
	}
	return s.CloneURL(accountID), nil
}

// Tree lists main of account's repository recursively. Submodules are
// listed as directories ("tree", with the commit they record as sha): the
// contract's types are blob and tree, and in the workspace a submodule is
// a directory.
func (s *Service) Tree(ctx context.Context, accountID string) ([]TreeEntry, bool, error) {
	entries, truncated, err := s.opts.Repos.Tree(ctx, accountID)
	if err != nil {
		return nil, false, mapErr(err)
	}
	out := make([]TreeEntry, len(entries))
	sizes := make([]int64, len(entries))
	for i, e := range entries {
		out[i] = TreeEntry{Path: e.Path, Type: "tree", SHA: e.SHA}
		if e.Type == "blob" {
			sizes[i] = e.Size
			out[i].Type, out[i].Size = "blob", &sizes[i]
		}
	}
	return out, truncated, nil
}

// Read returns the file at path on main, following submodules. A file
// larger than the repositories' read limit is refused (413) from its size
// alone, before any of it is read.
func (s *Service) Read(ctx context.Context, accountID, path string) ([]byte, error) {
	data, err := s.opts.Repos.ReadFile(ctx, accountID, path)
	var big *repo.TooLargeError
	if errors.As(err, &big) {
		return nil, userError(errdefs.ErrTooLarge, "File is larger than %s (%s), the most the API reads; clone the repository to read it",
			fetch.FormatSize(big.Limit), formatMiB(big.Size))
	}
	if err != nil {
		return nil, mapErr(err)
	}
	return data, nil
}

// formatMiB writes n bytes with one decimal, in MiB from 1 MiB on.
func formatMiB(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// quotaError says, in words for the caller, why a write was refused by a
// repository quota (429).
func quotaError(q *repo.QuotaError) error {
	return userError(errdefs.ErrQuota, "Upload refused: the repository would pass its storage quota of %s (%s used); nothing was written",
		fetch.FormatSize(q.Quota), formatMiB(q.Used))
}

// inFlightError says that an upload was refused because the account's
// other uploads in flight hold the room its quota has left (429).
func inFlightError(q *repo.QuotaError, e *store.UploadQuotaError) error {
	uploads := "uploads"
	if e.OtherCount == 1 {
		uploads = "upload"
	}
	return userError(errdefs.ErrQuota, "Upload refused: the repository would pass its storage quota of %s (%s used, %s held by %d other %s in flight); nothing was written",
		fetch.FormatSize(q.Quota), formatMiB(q.Used), formatMiB(e.Others), e.OtherCount, uploads)
}

// userError is an error of kind sentinel whose message, format and args,
// the API shows the caller.
func userError(sentinel error, format string, args ...any) error {
	return errdefs.Newf(sentinel, format, args...)
}

// invalid is a request error whose message the API shows the caller (400).
func invalid(msg string) error { return errdefs.New(errdefs.ErrInvalid, msg) }

// mapErr maps repo's errors onto the API's sentinels.
func mapErr(err error) error {
	switch {
	case errors.Is(err, repo.ErrNoRepository):
		return fmt.Errorf("%w: %w", errdefs.ErrNoRepository, err)
	case errors.Is(err, repo.ErrNotFound):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case errors.Is(err, repo.ErrInvalidAccount):
		return invalid("account_id must be a valid UUID")
	}
	return err
}

// item is one file of an upload on its way to the repository.
type item struct {
	name    string // as the caller named it, for failures
	path    string // target path in the repository
	file    *os.File
	size    int64
	failure string // why it did not arrive; "" when it did
}

// Upload downloads req.Files concurrently and commits the ones that arrived
// into req.Dir of main in one commit with req.Message (into a submodule's
// repository when the path lies inside one). Failed files come back as
// "name: reason"; when none arrived, uploaded is empty and err nil, and
// nothing is committed.
func (s *Service) Upload(ctx context.Context, accountID string, req Upload) ([]Committed, []string, error) {
	if len(req.Files) == 0 {
		return nil, nil, invalid("At least one file is required")
	}
	if len(req.Files) > maxFilesPerUpload {
		return nil, nil, invalid(fmt.Sprintf("At most %d files can be uploaded at once", maxFilesPerUpload))
	}
	dir, err := cleanDir(req.Dir)
	if err != nil {
		return nil, nil, err
	}
	budget, err := s.newBudget(ctx, accountID)
	if err != nil {
		return nil, nil, err
	}
	defer budget.release(ctx) // after the files are gone
	items := make([]*item, len(req.Files))
	for i, f := range req.Files {
		items[i] = &item{name: f.Name}
	}
	defer removeAll(items)
	planTargets(items, dir)
	sem := make(chan struct{}, s.opts.Concurrency)
	var wg sync.WaitGroup
	for i, it := range items {
		if it.failure != "" {
			continue
		}
		// Taking the slot before starting keeps downloads in request order
		// and the number of goroutines bounded.
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.download(ctx, it, req.Files[i].URL, budget)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if err := budget.refusal(); err != nil {
		return nil, nil, err
	}
	return s.commit(ctx, accountID, dir, req.Message, items)
}

// newBudget is the budget of one upload to account's repository: the
// upload limit, and no more than the room left in the repository's quota
// that the account's other uploads in flight have not reserved, so that
// the temporary files stop growing once the upload could not be committed
// anyway. A repository already at its quota, or whose room other uploads
// hold, refuses the upload before anything is downloaded. The budget's
// reservation must be released (release).
func (s *Service) newBudget(ctx context.Context, accountID string) (*budget, error) {
	b := &budget{max: s.opts.MaxUploadBytes}
	quota := s.opts.Repos.Limits().QuotaBytes
	if quota <= 0 {
		return b, nil
	}
	used, err := s.opts.Repos.Usage(ctx, accountID)
	if err != nil {
		return nil, mapErr(err)
	}
	b.quota = &repo.QuotaError{Owner: accountID, Used: used, Quota: quota}
	if used >= quota {
		return nil, quotaError(b.quota)
	}
	room := quota - used
	if room < b.max {
		b.max, b.byQuota = room, true
	}
	// The room is the account's, shared by its uploads: each reserves
	// what it spools (the usage read here may be a little behind one that
	// commits meanwhile; the commit checks the quota again).
	if b.hold, err = newHold(ctx, s.opts.Reservations, s.log, accountID, room, b.max); err != nil {
		return nil, b.explain(err)
	}
	return b, nil
}

// download fetches url into a temporary file for it.
func (s *Service) download(ctx context.Context, it *item, url string, b *budget) {
	f, err := os.CreateTemp(s.opts.TempDir, "sandboxd-upload-")
	if err != nil {
		s.log.ErrorContext(ctx, "upload: create temporary file", "err", err)
		it.failure = "could not store the download"
		return
	}
	it.file = f
	bw := &budgetWriter{ctx: ctx, w: f, b: b}
	res, err := s.opts.Fetcher.Fetch(ctx, url, bw)
	if err != nil {
		bw.refund()
		it.discard()
		if errors.Is(err, errBudget) || errors.Is(err, errRefused) {
			it.failure = b.failure(err)
		} else {
			it.failure = fetch.Reason(err)
		}
		s.log.InfoContext(ctx, "upload: download failed", "name", it.name, "reason", it.failure, "err", err)
		return
	}
	it.size = res.Size
}

// discard frees the disk a file that failed took: its bytes no longer
// count against the upload's budget.
func (it *item) discard() {
	if it.file != nil {
		_ = it.file.Truncate(0)
	}
}

// commit commits the items that arrived and reports the others.
func (s *Service) commit(ctx context.Context, accountID, dir, message string, items []*item) ([]Committed, []string, error) {
	var (
		files    []repo.File
		failures []string
	)
	for _, it := range items {
		if it.failure != "" {
			failures = append(failures, it.name+": "+it.failure)
			continue
		}
		if _, err := it.file.Seek(0, io.SeekStart); err != nil {
			return nil, nil, fmt.Errorf("rewind upload of %s: %w", it.name, err)
		}
		files = append(files, repo.File{Path: it.path, Content: it.file, Size: it.size})
	}
	if len(files) == 0 {
		return []Committed{}, failures, nil
	}
	if message == "" {
		message = DefaultMessage
	}
	commit, blobs, err := s.opts.Repos.CommitFiles(ctx, accountID, repo.MainBranch, files, message, s.opts.Author)
	if err != nil {
		s.log.InfoContext(ctx, "upload not committed", "account", accountID, "err", err)
		return nil, nil, commitError(dir, err)
	}
	uploaded := make([]Committed, 0, len(files))
	for _, f := range files {
		uploaded = append(uploaded, Committed{Path: f.Path, SHA: blobs[f.Path]})
	}
	s.log.InfoContext(ctx, "upload committed", "account", accountID, "commit", commit, "files", len(uploaded), "failed", len(failures))
	return uploaded, failures, nil
}

// commitError says why files could not be committed, in words for users
// where the cause is theirs.
func commitError(dir string, err error) error {
	where := "the repository root"
	if dir != "" {
		where = dir
	}
	var q *repo.QuotaError
	if errors.As(err, &q) {
		return quotaError(q)
	}
	switch {
	case errors.Is(err, repo.ErrReadOnly):
		return userError(errdefs.ErrForbidden, "Cannot write into %s: it lies in the repository of an organization, which its members may read but not write (as with git push)", where)
	case errors.Is(err, repo.ErrInvalidPath):
		return invalid("Cannot write into " + where + ": a file, directory or submodule there is in the way")
	case errors.Is(err, repo.ErrNotFound):
		return invalid("Cannot write into " + where + ": it lies in a submodule whose repository is not available here")
	case errors.Is(err, repo.ErrConflict):
		return invalid("The repository kept changing during the upload; try again")
	case errors.Is(err, repo.ErrInvalidAccount):
		return mapErr(err)
	}
	return err
}

// cleanDir validates the target directory of an upload.
func cleanDir(p string) (string, error) {
	p = strings.Trim(strings.TrimSpace(p), "/")
	if p == "" {
		return "", nil
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || seg == "." || seg == "" || strings.ContainsRune(seg, 0) || strings.EqualFold(seg, ".git") {
			return "", invalid("path must stay inside the repository")
		}
	}
	return p, nil
}

// validName reports whether name can be a file name in the repository: the
// API refuses the same names, but this service does not rely on it.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.EqualFold(name, ".git") &&
		!strings.ContainsAny(name, "/\\\x00")
}

// planTargets sets each item's target path, failing invalid names and
// names given twice (the first one wins).
func planTargets(items []*item, dir string) {
	seen := map[string]bool{}
	for _, it := range items {
		if it.failure != "" {
			continue
		}
		if !validName(it.name) {
			it.failure = "invalid file name"
			continue
		}
		it.path = it.name
		if dir != "" {
			it.path = dir + "/" + it.name
		}
		if seen[it.path] {
			it.failure = "file name given more than once"
			continue
		}
		seen[it.path] = true
	}
}

func removeAll(items []*item) {
	for _, it := range items {
		if it.file != nil {
			it.file.Close()
			os.Remove(it.file.Name())
		}
	}
}

// errBudget is a write past the upload's total budget.
var errBudget = errors.New("upload budget exceeded")

// budget is the bytes all files of one upload may take together.
type budget struct {
	max  int64
	used atomic.Int64
	// byQuota: max is the room left in the repository's quota (then
	// quota describes it), not the upload limit.
	byQuota bool
	quota   *repo.QuotaError
	// hold reserves, as files arrive, the room they take of what the
	// account's uploads share; nil without a quota.
	hold *hold

	mu sync.Mutex
	// refused is why the whole upload is refused, once it is: a file
	// past the quota, room that other uploads hold, or a reservation that
	// failed.
	refused error
}

// reserve makes the upload's reservation cover total bytes; a refusal
// refuses the whole upload (errRefused).
func (b *budget) reserve(ctx context.Context, total int64) error {
	if b.hold == nil {
		return nil
	}
	if err := b.hold.cover(ctx, total); err != nil {
		b.refuse(b.explain(err))
		return errRefused
	}
	return nil
}

// explain turns a reservation's error into the caller's words when the
// quota refused it.
func (b *budget) explain(err error) error {
	var e *store.UploadQuotaError
	if errors.As(err, &e) {
		return inFlightError(b.quota, e)
	}
	return fmt.Errorf("reserve room for an upload: %w", err)
}

// refuse records the first reason the whole upload is refused.
func (b *budget) refuse(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refused == nil {
		b.refused = err
	}
}

// refusal is why the whole upload is refused, or nil: what did arrive is
// not committed either, so the caller learns about the quota once, not
// file by file.
func (b *budget) refusal() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}

// failure is the reason given for a file that did not fit (err is
// errBudget or errRefused); past the quota, it refuses the whole upload.
func (b *budget) failure(err error) string {
	if errors.Is(err, errRefused) || b.byQuota {
		b.refuse(quotaError(b.quota))
		return "it would pass the repository's storage quota"
	}
	return "upload larger than " + fetch.FormatSize(b.max) + " in total"
}

// release gives back the room the upload reserved.
func (b *budget) release(ctx context.Context) {
	if b.hold != nil {
		b.hold.release(ctx)
	}
}

// budgetWriter charges what it writes to a budget.
type budgetWriter struct {
	ctx     context.Context
	w       io.Writer
	b       *budget
	charged int64
}

func (bw *budgetWriter) Write(p []byte) (int, error) {
	bw.charged += int64(len(p))
	used := bw.b.used.Add(int64(len(p)))
	if used > bw.b.max {
		return 0, errBudget
	}
	if err := bw.b.reserve(bw.ctx, used); err != nil {
		return 0, err
	}
	return bw.w.Write(p)
}

// refund gives back what a failed file took, for the files still coming.
func (bw *budgetWriter) refund() { bw.b.used.Add(-bw.charged) }
