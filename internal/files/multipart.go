package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"os"

	"github.com/sandboxd/sandboxd/internal/fetch"
)

// maxFieldBytes bounds the text fields of a multipart upload.
const maxFieldBytes = 64 << 10

// UploadMultipart commits the files of a multipart/form-data body like
// Upload does downloads: each part named "file" is a file (named by its
// filename), the fields "path" and "message" are as in the JSON body. Parts
// are streamed to temporary files, each capped like a download and all
// together by MaxUploadBytes; a file over its cap is reported as a failure
// and the others are still committed. A file past the repository's quota,
// or past the room the account's other uploads in flight left, refuses
// the whole upload at once (429), without reading the rest of the body.
func (s *Service) UploadMultipart(ctx context.Context, accountID string, mr *multipart.Reader) ([]Committed, []string, error) {
	var (
		items        []*item
		dir, message string
		perFile      = s.opts.Fetcher.MaxBytes()
		parseProblem error
	)
	budget, err := s.newBudget(ctx, accountID)
	if err != nil {
		return nil, nil, err
	}
	defer budget.release(ctx)
	defer func() { removeAll(items) }()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, invalid("Request body must be valid multipart/form-data")
		}
		switch name := part.FormName(); name {
		case "path", "message":
			v, err := io.ReadAll(io.LimitReader(part, maxFieldBytes+1))
			if err != nil || len(v) > maxFieldBytes {
				return nil, nil, invalid(name + " is too long")
			}
			if name == "path" {
				dir = string(v)
			} else {
				message = string(v)
			}
		case "file", "files":
			if len(items) == maxFilesPerUpload {
				return nil, nil, invalid(fmt.Sprintf("At most %d files can be uploaded at once", maxFilesPerUpload))
			}
			it := &item{name: part.FileName()}
			items = append(items, it)
			if it.name == "" && parseProblem == nil {
				parseProblem = invalid("Each file must have a name")
			}
			if err := s.spoolPart(ctx, it, part, perFile, budget); err != nil {
				return nil, nil, err
			}
		default:
			// Unknown fields are skipped, as unknown JSON fields are.
			if _, err := io.Copy(io.Discard, io.LimitReader(part, maxFieldBytes)); err != nil {
				return nil, nil, invalid("Request body must be valid multipart/form-data")
			}
		}
		part.Close()
	}
	if len(items) == 0 {
		return nil, nil, invalid("At least one file is required")
	}
	if parseProblem != nil {
		return nil, nil, parseProblem
	}
	d, err := cleanDir(dir)
	if err != nil {
		return nil, nil, err
	}
	planTargets(items, d)
	return s.commit(ctx, accountID, d, message, items)
}

// spoolPart copies a file part to a temporary file, within the per-file
// cap and the upload's budget; a part over either is recorded as the
// item's failure and the rest of it is skipped. A broken request body is
// an error, and so is a part that refuses the whole upload (the quota).
func (s *Service) spoolPart(ctx context.Context, it *item, part io.Reader, perFile int64, b *budget) error {
	f, err := os.CreateTemp(s.opts.TempDir, "sandboxd-upload-")
	if err != nil {
		return fmt.Errorf("create temporary file for %s: %w", it.name, err)
	}
	it.file = f
	bw := &budgetWriter{ctx: ctx, w: f, b: b}
	n, err := io.Copy(bw, io.LimitReader(part, perFile+1))
	switch {
	case errors.Is(err, errBudget), errors.Is(err, errRefused):
		it.failure = b.failure(err)
	case err != nil:
		return invalid("Request body ended before file " + it.name + " did")
	case n > perFile:
		it.failure = (&fetch.TooLargeError{Limit: perFile}).Error()
	}
	if it.failure != "" {
		bw.refund()
		it.discard()
		s.log.InfoContext(ctx, "upload: part refused", "name", it.name, "reason", it.failure)
		if err := b.refusal(); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			return invalid("Request body ended before file " + it.name + " did")
		}
		return nil
	}
	it.size = n
	return nil
}
