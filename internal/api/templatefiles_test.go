package api_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestTemplateFilesRoutes: PUT /api/templates/files/{hash} stores an
// archive for the caller's account (200 with what it holds), GET answers
// whether the account has it (never another account's); a bad name or a
// hostile archive is 400, one over the bound 413.
func TestTemplateFilesRoutes(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	keys := accountKeys(t, st, "alice", "bob")
	blobs, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := templates.New(templates.Config{Store: st, NodeID: "here", Dir: filepath.Join(t.TempDir(), "templates"), Blobs: blobs, MaxUploadBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test", Templates: svc})
	if err != nil {
		t.Fatal(err)
	}
	call := func(who, method, path string, body []byte) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("x-api-key", keys[who])
		req.Header.Set("Content-Type", "application/x-tar")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, rec.Body)
		}
		return rec.Code, out
	}
	archive := func(hdrs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, hdr := range hdrs {
			if err := tw.WriteHeader(hdr); err != nil {
				t.Fatal(err)
			}
			tw.Write(bytes.Repeat([]byte("x"), int(hdr.Size)))
		}
		tw.Close()
		return buf.Bytes()
	}
	hashOf := func(b []byte) string {
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	good := archive(&tar.Header{Typeflag: tar.TypeReg, Name: "a.txt", Mode: 0o644, Size: 3})
	hash := hashOf(good)
	if code, out := call("alice", "GET", "/api/templates/files/"+hash, nil); code != 200 || out["present"] != false {
		t.Fatalf("before: %d %v", code, out)
	}
	if code, out := call("alice", "PUT", "/api/templates/files/"+hash, good); code != 200 || out["present"] != true || out["entries"] != 1.0 || out["bytes"] != 3.0 || out["hash"] != hash {
		t.Fatalf("put: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/templates/files/"+hash, nil); code != 200 || out["present"] != true || out["size"] != float64(len(good)) {
		t.Fatalf("after: %d %v", code, out)
	}
	if code, out := call("bob", "GET", "/api/templates/files/"+hash, nil); code != 200 || out["present"] != false {
		t.Fatalf("bob: %d %v", code, out)
	}
	for _, c := range []struct {
		path string
		body []byte
		code int
		says string
	}{
		{"/api/templates/files/xyz", good, 400, "not 64 lower-case hex digits"},
		{"/api/templates/files/" + strings.Repeat("b", 64), archive(&tar.Header{Typeflag: tar.TypeReg, Name: "../x", Mode: 0o644}), 400, "path traversal"},
		{"/api/templates/files/" + strings.Repeat("b", 64), archive(&tar.Header{Typeflag: tar.TypeChar, Name: "null"}), 400, "device node"},
		{"/api/templates/files/" + strings.Repeat("b", 64), []byte("not a tar at all, just text that goes on"), 400, "not a whole tar archive"},
		{"/api/templates/files/" + strings.Repeat("b", 64), archive(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 8192}), 413, "larger than"},
	} {
		if code, out := call("alice", "PUT", c.path, c.body); code != c.code || !strings.Contains(out["error"].(string), c.says) {
			t.Errorf("PUT %s: %d %v, want %d saying %q", c.path, code, out, c.code, c.says)
		}
	}
	if code, out := call("alice", "GET", "/api/templates/files/"+strings.Repeat("b", 64), nil); code != 200 || out["present"] != false {
		t.Fatalf("a refused upload is recorded: %d %v", code, out)
	}
}
