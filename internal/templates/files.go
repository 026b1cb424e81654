package templates

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// Uploaded build files: the archives COPY steps copy from (E2B's
// "files/{hash}" in a team's cache). An account uploads an archive — a
// tar, or a gzip of one, told apart by its first bytes, never by a name —
// under a name of its choosing, a SHA-256 in hex (E2B's SDK computes its
// filesHash over the paths, modes, sizes and bytes of the files; the CLI
// the archive's own hash). The server cannot recompute E2B's, so the name
// is opaque: it names the account's upload, nothing more, and one
// account's name never reaches another's files.
//
// The archive is checked as it arrives (checkArchive: no entry outside
// it, no device, bounded), stored content-addressed in the blob store,
// and its blob recorded per account in the build cache
// (store.TemplateLayer) under the key "files/<hash>", which no step key
// (hex) can equal. An upload is a cache: a later one of the same name
// replaces it; GC may drop it, and a build then fails asking for it again.

// DefaultMaxUploadBytes bounds an uploaded archive as sent
// (--templates-max-upload-mib).
const DefaultMaxUploadBytes = 512 << 20

// maxArchiveEntries bounds the entries of one archive.
const maxArchiveEntries = 100_000

// uploadLinkTTL is how long a signed upload link (E2B's file upload URL)
// is good for: the SDK uploads at once; its own timeout is an hour.
const uploadLinkTTL = time.Hour

// FilesInfo describes an account's uploaded archive.
type FilesInfo struct {
	Hash string
	Size int64 // the archive as uploaded
	// Entries and Bytes count what it holds (Put only).
	Entries int
	Bytes   int64
}

// CheckFilesHash checks an upload's name: 64 lower-case hex digits.
func CheckFilesHash(hash string) error {
	if !blob.ValidKey(hash) {
		return errdefs.Newf(errdefs.ErrInvalid, "the files hash %q is not 64 lower-case hex digits (a SHA-256)", clipHash(hash))
	}
	return nil
}

func clipHash(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// filesCacheKey is the build cache's key of an upload.
func filesCacheKey(hash string) string { return "files/" + hash }

// maxUpload is the bound of one archive as sent.
func (s *Service) maxUpload() int64 {
	if s.cfg.MaxUploadBytes > 0 {
		return s.cfg.MaxUploadBytes
	}
	return DefaultMaxUploadBytes
}

// archiveLimits bound what one archive holds: four times its bound as
// sent in content (a gzip stream may hold far more than it weighs), and
// maxArchiveEntries entries.
func (s *Service) archiveLimits() archiveLimits {
	return archiveLimits{Bytes: 4 * s.maxUpload(), Entries: maxArchiveEntries}
}

// MaxUploadBytes is the most one upload may weigh as sent.
func (s *Service) MaxUploadBytes() int64 { return s.maxUpload() }

// HasFiles reports whether p's account has uploaded an archive named hash
// whose blob is still stored.
func (s *Service) HasFiles(ctx context.Context, p auth.Principal, hash string) (FilesInfo, bool, error) {
	if err := s.canUpload(p, hash); err != nil {
		return FilesInfo{}, false, err
	}
	return s.files(ctx, p.AccountID, hash)
}

func (s *Service) files(ctx context.Context, accountID, hash string) (FilesInfo, bool, error) {
	l, err := s.st.UseTemplateLayer(ctx, accountID, filesCacheKey(hash))
	if errors.Is(err, store.ErrNotFound) {
		return FilesInfo{}, false, nil
	}
	if err != nil {
		return FilesInfo{}, false, err
	}
	info, err := s.cfg.Blobs.Stat(ctx, l.BlobKey)
	if errors.Is(err, blob.ErrNotFound) {
		return FilesInfo{}, false, nil
	}
	if err != nil {
		return FilesInfo{}, false, err
	}
	return FilesInfo{Hash: hash, Size: info.Size}, true, nil
}

// PutFiles stores r, an archive, as p's account's upload named hash: it
// is checked as it streams (checkArchive) and refused whole when any
// entry is (400), or when it weighs more than MaxUploadBytes or holds
// more than its limits (413); nothing is recorded then.
func (s *Service) PutFiles(ctx context.Context, p auth.Principal, hash string, r io.Reader) (FilesInfo, error) {
	if err := s.canUpload(p, hash); err != nil {
		return FilesInfo{}, err
	}
	return s.putFiles(ctx, p.AccountID, hash, r)
}

func (s *Service) canUpload(p auth.Principal, hash string) error {
	if s.cfg.Blobs == nil {
		return errdefs.New(errdefs.ErrInvalid, "this server keeps no build files (it has no blob store)")
	}
	if p.AccountID == "" {
		return errdefs.New(errdefs.ErrForbidden, "build files belong to an account")
	}
	return CheckFilesHash(hash)
}

func (s *Service) putFiles(ctx context.Context, accountID, hash string, r io.Reader) (FilesInfo, error) {
	max := s.maxUpload()
	body := &boundedReader{r: r, left: max}
	pr, pw := io.Pipe()
	type put struct {
		info blob.Info
		err  error
	}
	done := make(chan put, 1)
	go func() {
		info, err := s.cfg.Blobs.Put(ctx, pr)
		pr.CloseWithError(err)
		done <- put{info, err}
	}()
	// What is checked is what is stored: the check reads through the pipe.
	tee := io.TeeReader(body, pw)
	st, err := checkArchive(tee, s.archiveLimits(), nil)
	if err == nil {
		// The rest (a gzip trailer, tar padding) is stored too, within
		// the bound.
		_, err = io.Copy(io.Discard, tee)
	}
	if body.over {
		err = errdefs.Newf(errdefs.ErrTooLarge, "the archive is larger than %s, the most one upload may weigh", humanize.IBytes(uint64(max)))
	}
	pw.CloseWithError(err)
	res := <-done
	if res.err != nil && errors.Is(err, io.ErrClosedPipe) {
		// The store failed first, and the check only saw its pipe close.
		return FilesInfo{}, fmt.Errorf("store the archive: %w", res.err)
	}
	if err != nil {
		return FilesInfo{}, err
	}
	if res.err != nil {
		return FilesInfo{}, fmt.Errorf("store the archive: %w", res.err)
	}
	if err := s.st.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: accountID, CacheKey: filesCacheKey(hash), BlobKey: res.info.Key, Size: res.info.Size}); err != nil {
		return FilesInfo{}, err
	}
	return FilesInfo{Hash: hash, Size: res.info.Size, Entries: st.Entries, Bytes: st.Bytes}, nil
}

// openUpload opens the blob of an upload resolveUploads found.
func (s *Service) openUpload(ctx context.Context, blobKey string) (io.ReadCloser, error) {
	rc, err := s.cfg.Blobs.Get(ctx, blobKey)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrInvalid, "the uploaded files went missing during the build: upload them again")
	}
	return rc, err
}

// boundedReader reads at most left bytes of r and notes a body that had
// more.
type boundedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more says whether the body goes on.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.over = true
			return 0, errdefs.New(errdefs.ErrTooLarge, "the archive is over the upload limit")
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// Signed upload links: E2B's SDK PUTs an archive to the URL the server
// answered, without its API key, so the URL carries its own authority: an
// HMAC-SHA256, with the server's upload key, of the account, the hash
// and an expiry. It is good for that account's upload of that hash only,
// until it expires, and bounded as any upload.

// UploadLink is what a signed upload URL carries besides the hash.
type UploadLink struct {
	AccountID string
	Expires   int64 // unix seconds
	Signature string
}

// SignUpload signs an upload of hash for accountID, good for an hour
// from now.
func (s *Service) SignUpload(accountID, hash string, now time.Time) UploadLink {
	l := UploadLink{AccountID: accountID, Expires: now.Add(uploadLinkTTL).Unix()}
	l.Signature = hex.EncodeToString(s.uploadMAC(accountID, hash, l.Expires))
	return l
}

// PutSignedFiles is PutFiles authorised by a signed link instead of a
// key: refused (403) unless l was signed by this server (or its cluster)
// for hash and has not expired.
func (s *Service) PutSignedFiles(ctx context.Context, hash string, l UploadLink, now time.Time, r io.Reader) (FilesInfo, error) {
	if err := CheckFilesHash(hash); err != nil {
		return FilesInfo{}, err
	}
	sig, err := hex.DecodeString(l.Signature)
	if err != nil || l.AccountID == "" || !hmac.Equal(sig, s.uploadMAC(l.AccountID, hash, l.Expires)) {
		return FilesInfo{}, errdefs.New(errdefs.ErrForbidden, "the upload link is not valid for these files")
	}
	if now.Unix() > l.Expires {
		return FilesInfo{}, errdefs.New(errdefs.ErrForbidden, "the upload link has expired; ask for a new one")
	}
	if err := s.canUpload(auth.Principal{AccountID: l.AccountID}, hash); err != nil {
		return FilesInfo{}, err
	}
	return s.putFiles(ctx, l.AccountID, hash, r)
}

func (s *Service) uploadMAC(accountID, hash string, expires int64) []byte {
	m := hmac.New(sha256.New, s.uploadKey)
	// No field holds a newline (an account id, hex, digits): one way to
	// read the message.
	for _, v := range []string{"sandboxd template files upload v1", accountID, hash, strconv.FormatInt(expires, 10)} {
		m.Write([]byte(v))
		m.Write([]byte{'\n'})
	}
	return m.Sum(nil)
}

// uploadKey is the key upload links are signed with: derived from
// secret (the cluster's, so that any node takes a link another made),
// or random for this process when there is none (links then end with
// it, at most an hour early).
func uploadKey(secret []byte) ([]byte, error) {
	if len(secret) == 0 {
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("templates: an upload key: %w", err)
		}
		return k, nil
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("sandboxd template upload links"))
	return m.Sum(nil), nil
}

// checkUploads refuses a definition whose COPY steps name files the
// account has not uploaded (400 naming the step), so that a build does
// not start to fail at its first COPY.
func (s *Service) checkUploads(ctx context.Context, accountID, def string) error {
	if accountID == "" {
		return nil // refused as such by Build
	}
	var d definition
	if err := json.Unmarshal([]byte(def), &d); err != nil {
		return fmt.Errorf("read the definition: %w", err)
	}
	check := func(what, hash string) error {
		if _, ok, err := s.files(ctx, accountID, hash); err != nil || ok {
			return err
		}
		return errdefs.Newf(errdefs.ErrInvalid, "%s: the files %s are not uploaded: PUT them to /api/templates/files/%s first", what, hash, hash)
	}
	if d.Context != "" {
		return check("context", d.Context)
	}
	for i, st := range d.Steps {
		if st.Kind == templatespec.StepCopy {
			if err := check(fmt.Sprintf("steps[%d] (COPY %s)", i, clipLine(st.Src)), st.FilesHash); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveUploads finds the blob of each COPY step's files once, when the
// build starts: the copies read those blobs, and the cache keys are
// computed over them (keySteps: steps with each FilesHash replaced by its
// blob's content address), so that files uploaded again under a name
// with other bytes make other keys, and a copy never reads bytes other
// than its key names. A COPY whose files are missing fails the build
// naming the step.
func (s *Service) resolveUploads(ctx context.Context, accountID string, steps []templatespec.Step) (map[string]string, []templatespec.Step, error) {
	uploads := map[string]string{}
	keySteps := append([]templatespec.Step(nil), steps...)
	for i, st := range steps {
		if st.Kind != templatespec.StepCopy {
			continue
		}
		key, ok := uploads[st.FilesHash]
		if !ok {
			l, err := s.st.UseTemplateLayer(ctx, accountID, filesCacheKey(st.FilesHash))
			if err == nil {
				_, err = s.cfg.Blobs.Stat(ctx, l.BlobKey)
			}
			switch {
			case errors.Is(err, store.ErrNotFound) || errors.Is(err, blob.ErrNotFound):
				return nil, nil, errdefs.Newf(errdefs.ErrInvalid, "step %d (COPY %s): the uploaded files %s are missing (never uploaded, or collected since): upload them again", i+1, clipLine(st.Src), short(st.FilesHash))
			case err != nil:
				return nil, nil, err
			}
			key = l.BlobKey
			uploads[st.FilesHash] = key
		}
		keySteps[i].FilesHash = key
	}
	return uploads, keySteps, nil
}
