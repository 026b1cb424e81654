package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestRepositoryLimitsInAnswers drives the API over the real file service
// and repositories with small limits, and checks how each limit is
// answered: the status, the error body, and the tree's truncation marker.
func TestRepositoryLimitsInAnswers(t *testing.T) {
	securitytest.Attack(t, "api",
		"a tenant reads a file past the read limit, lists a tree past the entry limit and uploads past its repository quota through the API",
		"413 and 429 with the contract's error body naming the limit; the tree answers 200 with its first entries and filetree_truncated: true, which a tree within the limit does not carry")
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	acct := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		t.Fatal(err)
	}
	key, prefix, hash, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(ctx, &store.APIKey{AccountID: acct.ID, Prefix: prefix, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	authn := auth.NewAuthenticator(st)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(bytes.Repeat([]byte("u"), 64<<10)) }))
	t.Cleanup(origin.Close)

	root := filepath.Join(t.TempDir(), "repos")
	serve := func(limits repo.Limits) (*repo.Manager, http.Handler) {
		repos, err := repo.New(repo.Options{Root: root, Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := files.New(files.Options{Repos: repos, Fetcher: fetch.New(fetch.Options{AllowPrivate: true}), PublicURL: "http://127.0.0.1:1", TempDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := api.New(api.Options{Store: st, Auth: authn, Version: "test", Files: svc})
		if err != nil {
			t.Fatal(err)
		}
		return repos, srv
	}
	call := func(h http.Handler, method, path, body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, rec.Body)
		}
		return rec.Code, out
	}

	repos, h := serve(repo.Limits{MaxReadBytes: 1 << 10, TreeMaxEntries: 2})
	if _, _, err := repos.CommitFiles(ctx, acct.ID, repo.MainBranch, []repo.File{
		repo.BytesFile("a.txt", []byte("a")), repo.BytesFile("big.txt", bytes.Repeat([]byte("b"), 2<<10)),
	}, "two", repo.Signature{}); err != nil {
		t.Fatal(err)
	}
	code, body := call(h, "GET", "/api/sandboxes/file?path=big.txt", "")
	if code != http.StatusRequestEntityTooLarge || body["status"] != "error" || body["error"] != "File is larger than 1 KiB (2.0 KiB), the most the API reads; clone the repository to read it" {
		t.Fatalf("read past the limit: %d %v", code, body)
	}
	if code, body := call(h, "GET", "/api/sandboxes/file?path=a.txt", ""); code != 200 || body["content"] != "a" {
		t.Fatalf("read within the limit: %d %v", code, body)
	}
	code, body = call(h, "GET", "/api/sandboxes", "")
	if _, marked := body["filetree_truncated"]; code != 200 || len(body["filetree"].([]any)) != 2 || marked {
		t.Fatalf("a whole tree at the limit: %d %v", code, body)
	}
	if _, _, err := repos.CommitFiles(ctx, acct.ID, repo.MainBranch, []repo.File{repo.BytesFile("c.txt", []byte("c"))}, "three", repo.Signature{}); err != nil {
		t.Fatal(err)
	}
	if code, body := call(h, "GET", "/api/sandboxes", ""); code != 200 || len(body["filetree"].([]any)) != 2 || body["filetree_truncated"] != true {
		t.Fatalf("tree past the limit: %d %v", code, body)
	}

	used, _ := repos.Usage(ctx, acct.ID)
	_, h = serve(repo.Limits{QuotaBytes: used + 16<<10})
	code, body = call(h, "POST", "/api/sandboxes/files", `{"files":[{"url":"`+origin.URL+`/u.bin","name":"u.bin"}]}`)
	if code != http.StatusTooManyRequests || body["status"] != "error" || !strings.HasPrefix(body["error"].(string), "Upload refused: the repository would pass its storage quota of ") {
		t.Fatalf("upload past the quota: %d %v", code, body)
	}
}
