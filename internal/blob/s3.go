package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says where an S3 store keeps its blobs.
type S3Config struct {
	Endpoint  string // host[:port], no scheme
	Bucket    string
	Prefix    string // prepended to object names; "" or ending in "/"
	AccessKey string
	SecretKey string
	Region    string // "" means us-east-1
	// Insecure speaks plain HTTP instead of HTTPS.
	Insecure bool
	// SpoolDir is where Put stages content while hashing it; it needs room
	// for the largest blobs being put at once. "" means the system temp
	// directory.
	SpoolDir string
}

// DefaultRegion is the region used when S3Config.Region is empty: the one
// every S3-compatible server accepts.
const DefaultRegion = "us-east-1"

// uploadThreads is how many parts of one blob upload at once. The parts are
// read from the spool file at their offsets, so more threads cost
// connections, not memory.
const uploadThreads = 4

// S3 stores blobs in a bucket of an S3-compatible object store, as objects
// named <prefix><key>.
//
// Put spools the content to a local file while hashing it and then uploads
// it under its final name with its size known. This was chosen over
// uploading a stream of unknown length to a temporary object and copying it
// into place (see the package tests' benchmarks): the upload can run in
// parallel parts straight from the file, content already stored is not
// uploaded at all, nothing is ever copied server-side, and no temporary
// objects can be left behind. The price is local disk for the blobs being
// put.
type S3 struct {
	client   *minio.Client
	bucket   string
	prefix   string
	spoolDir string
}

var _ Store = (*S3)(nil)

// NewS3 connects to an S3-compatible store and creates the bucket when it
// does not exist.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("open S3 blob store: endpoint and bucket are required")
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	}
	if err := os.MkdirAll(cfg.SpoolDir, 0o755); err != nil {
		return nil, fmt.Errorf("open S3 blob store: %w", err)
	}
	if err := removeStaleSpools(cfg.SpoolDir, time.Now().Add(-staleTempAge)); err != nil {
		return nil, fmt.Errorf("open S3 blob store: clean spool %s: %w", cfg.SpoolDir, err)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: !cfg.Insecure,
		Region: cfg.Region,
		// Path style works on every S3-compatible server and needs no
		// wildcard DNS for the bucket.
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("open S3 blob store %s: %w", cfg.Endpoint, err)
	}
	s := &S3{client: client, bucket: cfg.Bucket, prefix: cfg.Prefix, spoolDir: cfg.SpoolDir}
	if err := s.ensureBucket(ctx, cfg.Region); err != nil {
		return nil, fmt.Errorf("open S3 blob store %s/%s: %w", cfg.Endpoint, cfg.Bucket, err)
	}
	return s, nil
}

func (s *S3) ensureBucket(ctx context.Context, region string) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("check bucket: %w", err)
	}
	if ok {
		return nil
	}
	err = s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: region})
	if err != nil {
		// Another node may have created it since BucketExists.
		if code := minio.ToErrorResponse(err).Code; code == minio.BucketAlreadyOwnedByYou || code == minio.BucketAlreadyExists {
			return nil
		}
		return fmt.Errorf("create bucket: %w", err)
	}
	return nil
}

func (s *S3) object(key string) string { return s.prefix + key }

// isNotFound reports whether err is S3's answer for a missing object.
func isNotFound(err error) bool {
	resp := minio.ToErrorResponse(err)
	return resp.Code == minio.NoSuchKey || resp.StatusCode == http.StatusNotFound
}

// Put implements Store.
func (s *S3) Put(ctx context.Context, r io.Reader) (Info, error) {
	// The spool only has to outlive this call: no fsync.
	f, key, size, err := spool(ctx, s.spoolDir, r, false)
	if err != nil {
		return Info{}, fmt.Errorf("put blob: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	info, err := s.upload(ctx, key, size, f)
	if err != nil {
		return Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	return info, nil
}

// PutKnown implements Store.
func (s *S3) PutKnown(ctx context.Context, key string, size int64, r io.Reader) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	if info, err := s.Stat(ctx, key); err == nil {
		if info.Size != size {
			return fmt.Errorf("put blob: %w: %s is stored with %d bytes, not %d", ErrMismatch, key, info.Size, size)
		}
		return nil
	} else if !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("put blob: %w", err)
	}
	f, gotKey, gotSize, err := spool(ctx, s.spoolDir, r, false)
	if err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := checkMatch(key, size, gotKey, gotSize); err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	if _, err := s.upload(ctx, key, size, f); err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	return nil
}

// upload stores the spooled content of f under key unless an object of that
// size is already there.
func (s *S3) upload(ctx context.Context, key string, size int64, f *os.File) (Info, error) {
	if info, err := s.Stat(ctx, key); err == nil && info.Size == size {
		return info, nil
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return Info{}, err
	}
	// A SectionReader reads by offset, which lets minio-go upload the parts
	// in parallel without buffering them.
	up, err := s.client.PutObject(ctx, s.bucket, s.object(key), io.NewSectionReader(f, 0, size), size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		NumThreads:  uploadThreads,
	})
	if err != nil {
		return Info{}, fmt.Errorf("upload: %w", err)
	}
	if up.Size != size {
		return Info{}, fmt.Errorf("upload: stored %d bytes of %d", up.Size, size)
	}
	modified := up.LastModified
	if modified.IsZero() {
		// A single PUT's answer carries no date. Asking with a HEAD would
		// race Deletes; this node's clock is close enough.
		modified = time.Now()
	}
	return Info{Key: key, Size: size, Modified: modified}, nil
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get blob: %w", err)
	}
	// Core.GetObject sends the request now, so a missing blob is reported
	// here rather than on the first Read.
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, s.object(key), minio.GetObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("get blob %s: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("get blob %s: %w", key, err)
	}
	return newVerifyingReader(body, key, info.Size), nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, fmt.Errorf("stat blob: %w", err)
	}
	oi, err := s.client.StatObject(ctx, s.bucket, s.object(key), minio.StatObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return Info{}, fmt.Errorf("stat blob %s: %w", key, ErrNotFound)
		}
		return Info{}, fmt.Errorf("stat blob %s: %w", key, err)
	}
	return Info{Key: key, Size: oi.Size, Modified: oi.LastModified}, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	// S3 answers a delete of a missing object with success.
	if err := s.client.RemoveObject(ctx, s.bucket, s.object(key), minio.RemoveObjectOptions{}); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	return nil
}

// List implements Store. Objects under the prefix whose names are not keys
// are skipped.
func (s *S3) List(ctx context.Context, fn func(Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn fails
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if oi.Err != nil {
			return fmt.Errorf("list blobs: %w", oi.Err)
		}
		key := strings.TrimPrefix(oi.Key, s.prefix)
		if !ValidKey(key) {
			continue
		}
		if err := fn(Info{Key: key, Size: oi.Size, Modified: oi.LastModified}); err != nil {
			return err
		}
	}
	return nil
}
