package e2b

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestTemplateFileUploads: GET /templates/{id}/files/{hash} answers 201
// with whether the account has the files and a url signed for them; a
// PUT there without a key stores the archive, which the next answer
// says is present; the link is refused once expired, for another hash,
// and over the upload bound; a sandbox's own key may not ask.
func TestTemplateFileUploads(t *testing.T) {
	var svc *templates.Service
	f := newFixture(t, func(o *fixtureOptions) {
		blobs, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
		if err != nil {
			t.Fatal(err)
		}
		svc, err = templates.New(templates.Config{Store: o.Store.(*store.Store), NodeID: "n1", Dir: filepath.Join(t.TempDir(), "templates"), Blobs: blobs, MaxUploadBytes: 4096})
		if err != nil {
			t.Fatal(err)
		}
		o.Files = svc
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "app/a.txt", Mode: 0o644, Size: 2})
	tw.Write([]byte("hi"))
	tw.Close()
	archive := buf.Bytes()
	sum := sha256.Sum256([]byte("the SDK's filesHash"))
	hash := hex.EncodeToString(sum[:])
	key := map[string]string{"X-API-Key": f.key}

	var link fileUpload
	if resp := f.call("GET", "/templates/app/files/"+hash, key, nil, &link); resp.StatusCode != http.StatusCreated || link.Present || !strings.HasPrefix(link.URL, f.srv.URL+"/templates/app/files/"+hash+"?") {
		t.Fatalf("link: %d %+v", resp.StatusCode, link)
	}
	put := func(url string, body []byte) (int, string) {
		t.Helper()
		resp, err := http.DefaultClient.Do(mustRequest(t, "PUT", url, body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := put(strings.Replace(link.URL, hash, strings.Repeat("0", 64), 1), archive); code != http.StatusForbidden {
		t.Fatalf("another hash: %d %s", code, body)
	}
	if code, body := put(link.URL, bytes.Repeat([]byte{0}, 8192)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("over the bound: %d %s", code, body)
	}
	if code, body := put(link.URL, archive); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	if resp := f.call("GET", "/templates/app/files/"+hash, key, nil, &link); resp.StatusCode != http.StatusCreated || !link.Present || link.URL == "" {
		t.Fatalf("link once uploaded: %d %+v", resp.StatusCode, link)
	}
	f.now = f.now.Add(2 * time.Hour)
	if code, body := put(link.URL, archive); code != http.StatusForbidden || !strings.Contains(body, "expired") {
		t.Fatalf("an expired link: %d %s", code, body)
	}

	sb := f.create(f.key, nil)
	if resp := f.call("GET", "/templates/app/files/"+hash, map[string]string{"X-API-Key": f.sandboxKey(f.key, sb.SandboxID)}, nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a sandbox's key asks for a link: %d", resp.StatusCode)
	}
}

func mustRequest(t *testing.T, method, url string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
