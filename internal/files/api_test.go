package files_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/router"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestThroughAPI wires the service and the git server into the API server
// the way `sandboxd serve` does, and drives them as a client would: upload
// from a URL, list, read, then clone with the key.
func TestThroughAPI(t *testing.T) {
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

	origin := http.NewServeMux()
	origin.HandleFunc("/report.md", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# Report\n") })
	origin.HandleFunc("/pixel.png", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(files.PNGBytes) })
	fileSrv := httptest.NewServer(origin)
	t.Cleanup(fileSrv.Close)

	// The public URL is known only once the listener is; the handler is
	// set after.
	var handler http.Handler
	apiSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(apiSrv.Close)
	repos, err := repo.New(repo.Options{
		Root:      filepath.Join(t.TempDir(), "repos"),
		LocalURLs: []string{apiSrv.URL, "http://sandboxd.internal"},
		Access:    files.SubmoduleAccess{Auth: authn, Accounts: st},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := files.New(files.Options{Repos: repos, Fetcher: fetch.New(fetch.Options{AllowPrivate: true}), PublicURL: apiSrv.URL})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Store: st, Auth: authn, Version: "test", Files: svc})
	if err != nil {
		t.Fatal(err)
	}
	handler = router.New(router.Options{Routes: append(srv.Routes(), router.Route{Pattern: "/git/*", Handler: repos.GitHTTPHandler(authn)}),
		NotFound: http.HandlerFunc(srv.NotFound), MethodNotAllowed: http.HandlerFunc(srv.MethodNotAllowed)})

	call := func(method, path, body string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, apiSrv.URL+path, strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, path, err)
		}
		return resp.StatusCode
	}

	var up contract.UploadFilesResponse
	body := `{"files":[{"url":"` + fileSrv.URL + `/report.md","name":"report.md"},{"url":"` + fileSrv.URL + `/pixel.png","name":"pixel.png"},{"url":"` + fileSrv.URL + `/nope","name":"nope.txt"}],"path":"out"}`
	if code := call("POST", "/api/sandboxes/files", body, &up); code != 200 || len(up.Uploaded) != 2 || len(up.Errors) != 1 || up.Errors[0] != "nope.txt: HTTP 404" {
		t.Fatalf("upload: %d %+v", code, up)
	}

	var list contract.ListSandboxesResponse
	if code := call("GET", "/api/sandboxes", "", &list); code != 200 || list.GithubRepo == nil || *list.GithubRepo != apiSrv.URL+"/git/"+acct.ID+".git" {
		t.Fatalf("list: %d %+v", code, list)
	}
	sizes := map[string]int64{}
	for _, e := range list.Filetree {
		if e.Size != nil {
			sizes[e.Path] = *e.Size
		}
	}
	if sizes["out/report.md"] != 9 || sizes["out/pixel.png"] != int64(len(files.PNGBytes)) {
		t.Fatalf("filetree %+v", list.Filetree)
	}

	var file contract.FileResponse
	if code := call("GET", "/api/sandboxes/file?path=out/report.md", "", &file); code != 200 || file.Content != "# Report\n" || file.Encoding != "" {
		t.Fatalf("read text: %d %+v", code, file)
	}
	if code := call("GET", "/api/sandboxes/file?path=out/pixel.png", "", &file); code != 200 || file.Encoding != "base64" {
		t.Fatalf("read png: %d %+v", code, file)
	}
	if got, _ := base64.StdEncoding.DecodeString(file.Content); string(got) != string(files.PNGBytes) {
		t.Fatal("png changed on its way")
	}
	var errBody contract.ErrorBody
	if code := call("GET", "/api/sandboxes/file?path=out/missing.md", "", &errBody); code != 404 || errBody.Error != "File not found in repository" {
		t.Fatalf("missing file: %d %+v", code, errBody)
	}

	// The clone URL the API reported works with the key as the password.
	u, _ := url.Parse(*list.GithubRepo)
	u.User = url.UserPassword("x", key)
	wt := t.TempDir()
	files.Git(t, wt, "clone", "-q", u.String(), ".")
	if got, err := os.ReadFile(filepath.Join(wt, "out", "report.md")); err != nil || string(got) != "# Report\n" {
		t.Fatalf("cloned report.md = %q, %v", got, err)
	}
}
