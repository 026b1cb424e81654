package blob_test

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
)

// rawS3 is a direct client of the test server, to do to the bucket what the
// store never would.
type rawS3 struct {
	client *minio.Client
	bucket string
}

func dialRaw(t testing.TB, storeURL string) (rawS3, *url.URL) {
	t.Helper()
	u, err := url.Parse(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	secret, _ := u.User.Password()
	client, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(u.User.Username(), secret, ""),
		Region:       blob.DefaultRegion,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	bucket, _, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	return rawS3{client, bucket}, u
}

func (r rawS3) put(t testing.TB, name string, content []byte) {
	t.Helper()
	_, err := r.client.PutObject(t.Context(), r.bucket, name, bytes.NewReader(content), int64(len(content)), minio.PutObjectOptions{})
	if err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
}

func openS3(t *testing.T, storeURL string) blob.Store {
	t.Helper()
	s, err := blob.Open(t.Context(), storeURL, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func listKeys(t *testing.T, s blob.Store) []string {
	t.Helper()
	var keys []string
	if err := s.List(t.Context(), func(i blob.Info) error { keys = append(keys, i.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestS3DetectsCorruption(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	s := openS3(t, storeURL)
	raw, _ := dialRaw(t, storeURL)

	content := blobtest.Content(1, 1<<20)
	info, err := s.Put(t.Context(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	// Replace the object behind the store's back.
	damaged := bytes.Clone(content)
	damaged[12345] ^= 0x80
	raw.put(t, "blobs/"+info.Key, damaged)

	rc, err := s.Get(t.Context(), info.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); !errors.Is(err, blob.ErrCorrupt) {
		t.Fatalf("reading a damaged object: %v, want ErrCorrupt", err)
	}
}

// Stores under different prefixes of one bucket do not see each other's
// blobs, and objects under a prefix that are not blobs are not listed.
func TestS3Prefixes(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	a := openS3(t, storeURL)
	otherURL := strings.Replace(storeURL, "/blobs?", "/other?", 1)
	b := openS3(t, otherURL)
	raw, _ := dialRaw(t, storeURL)

	ia, err := a.Put(t.Context(), strings.NewReader("in a"))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := b.Put(t.Context(), strings.NewReader("in b"))
	if err != nil {
		t.Fatal(err)
	}
	raw.put(t, "blobs/notes.txt", []byte("not a blob"))
	raw.put(t, "blobs/tmp/"+ia.Key, []byte("nested, not a blob of this store"))
	raw.put(t, "blobs"+ib.Key, []byte("prefix without its slash"))

	if got := listKeys(t, a); len(got) != 1 || got[0] != ia.Key {
		t.Fatalf("store a lists %v, want [%s]", got, ia.Key)
	}
	if got := listKeys(t, b); len(got) != 1 || got[0] != ib.Key {
		t.Fatalf("store b lists %v, want [%s]", got, ib.Key)
	}
	if _, err := a.Stat(t.Context(), ib.Key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("store a sees store b's blob: %v", err)
	}
}

func TestS3CredentialsFromEnvironment(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	_, u := dialRaw(t, storeURL)
	secret, _ := u.User.Password()
	t.Setenv(blob.EnvS3AccessKey, u.User.Username())
	t.Setenv(blob.EnvS3SecretKey, secret)
	u.User = nil

	s := openS3(t, u.String())
	content := []byte("credentials from the environment")
	info, err := s.Put(t.Context(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != blob.Key(content) {
		t.Fatalf("Put = %s", info.Key)
	}
}

func TestS3WrongCredentials(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	_, u := dialRaw(t, storeURL)
	u.User = url.UserPassword(u.User.Username(), "not-the-secret")
	_, err := blob.Open(t.Context(), u.String(), t.TempDir())
	if err == nil {
		t.Fatal("Open with a wrong secret succeeded")
	}
	if strings.Contains(err.Error(), "not-the-secret") {
		t.Fatalf("error reveals the secret: %v", err)
	}
}

// A second store on an existing bucket reuses it, and sees what the first
// stored.
func TestS3ExistingBucket(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	first := openS3(t, storeURL)
	info, err := first.Put(t.Context(), strings.NewReader("kept"))
	if err != nil {
		t.Fatal(err)
	}
	second := openS3(t, storeURL)
	if _, err := second.Stat(t.Context(), info.Key); err != nil {
		t.Fatalf("second store on the bucket: %v", err)
	}
}

// Put stages content in the spool directory and leaves nothing there.
func TestS3SpoolIsCleaned(t *testing.T) {
	storeURL := blobtest.StartS3(t)
	spool := filepath.Join(t.TempDir(), "spool")
	s := openS3(t, storeURL+"&spool="+url.QueryEscape(spool))
	if _, err := s.Put(t.Context(), blobtest.Stream(2, 20<<20)); err != nil {
		t.Fatal(err)
	}
	content := []byte("known")
	if err := s.PutKnown(t.Context(), blob.Key(content), 5, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutKnown(t.Context(), blob.Key(content[:4]), 5, bytes.NewReader(content)); !errors.Is(err, blob.ErrMismatch) {
		t.Fatalf("PutKnown with a wrong key: %v", err)
	}
	if _, err := s.Put(t.Context(), io.MultiReader(strings.NewReader("x"), failing{})); err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	entries, err := os.ReadDir(spool)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("spool holds %d files after the puts", len(entries))
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("source failed") }
