package files

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// limitedService is a file service over the repositories at root with the
// given limits and access rule, downloading from origin.
func limitedService(t *testing.T, root string, limits repo.Limits, access repo.SubmoduleAccess) (*Service, *repo.Manager) {
	t.Helper()
	repos, err := repo.New(repo.Options{Root: root, Limits: limits, Access: access})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{
		Repos:     repos,
		Fetcher:   fetch.New(fetch.Options{AllowPrivate: true}),
		PublicURL: "http://127.0.0.1:8080",
		TempDir:   filepath.Join(t.TempDir(), "tmp"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc, repos
}

func TestUploadQuota(t *testing.T) {
	securitytest.Attack(t, "storage quotas",
		"a tenant uploads files that would take its repository past the account's quota, and uploads again once the repository is full",
		"the upload is refused (errdefs.ErrQuota, 429) with nothing committed; into a full repository, before anything is downloaded")
	ctx := context.Background()
	var hits atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write(bytes.Repeat([]byte("k"), 1000))
	}))
	t.Cleanup(origin.Close)
	root := filepath.Join(t.TempDir(), "repos")
	account := uuid.NewString()
	svc, repos := limitedService(t, root, repo.Limits{}, nil)
	if _, _, err := svc.Upload(ctx, account, Upload{Files: []Source{{URL: origin.URL, Name: "first.txt"}}}); err != nil {
		t.Fatal(err)
	}
	used, err := repos.Usage(ctx, account)
	if err != nil || used == 0 {
		t.Fatalf("Usage = %d, %v", used, err)
	}
	head, _ := repos.Head(ctx, account, repo.MainBranch)
	upload := func(svc *Service) error {
		_, _, err := svc.Upload(ctx, account, Upload{Files: []Source{{URL: origin.URL, Name: "a.txt"}, {URL: origin.URL, Name: "b.txt"}}})
		return err
	}

	// Room for one file of the two: neither is committed.
	svc, repos = limitedService(t, root, repo.Limits{QuotaBytes: used + 1500}, nil)
	err = upload(svc)
	if !errors.Is(err, errdefs.ErrQuota) || !strings.HasPrefix(err.Error(), "Upload refused: the repository would pass its storage quota of ") {
		t.Fatalf("upload past the quota: %v", err)
	}
	if now, _ := repos.Head(ctx, account, repo.MainBranch); now != head {
		t.Fatal("main moved")
	}
	// Full: refused before downloading.
	svc, _ = limitedService(t, root, repo.Limits{QuotaBytes: used}, nil)
	before := hits.Load()
	if err := upload(svc); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("upload into a full repository: %v", err)
	}
	if hits.Load() != before {
		t.Fatal("a full repository still downloaded")
	}
	// Unlimited, or with room: committed.
	svc, _ = limitedService(t, root, repo.Limits{QuotaBytes: -1}, nil)
	if err := upload(svc); err != nil {
		t.Fatal(err)
	}
}

func TestReadLimitAndReadOnlySubmodule(t *testing.T) {
	securitytest.Attack(t, "accounts",
		"an account uploads into a submodule whose repository it may read but not write (its organization's), and reads a file past the read limit",
		"the upload is errdefs.ErrForbidden (403) saying members may read but not write it, nothing moves; the read is errdefs.ErrTooLarge (413) naming the limit")
	ctx := context.Background()
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "x") }))
	t.Cleanup(origin.Close)
	readOnly := repo.AccessFunc(func(_ context.Context, _, _ string, use repo.Use) (bool, error) { return use == repo.UseRead, nil })
	svc, repos := limitedService(t, filepath.Join(t.TempDir(), "repos"), repo.Limits{MaxReadBytes: 1 << 10}, readOnly)
	member, org := uuid.NewString(), uuid.NewString()
	orgCommit, _, err := repos.CommitFiles(ctx, org, repo.MainBranch, []repo.File{repo.BytesFile("README.md", []byte("org"))}, "init", repo.Signature{})
	if err != nil {
		t.Fatal(err)
	}
	addGitlink(t, repos, member, "orgs/acme", "../"+org+".git", orgCommit)
	if got, err := svc.Read(ctx, member, "orgs/acme/README.md"); err != nil || string(got) != "org" {
		t.Fatalf("member reads the organization: %q, %v", got, err)
	}
	_, _, err = svc.Upload(ctx, member, Upload{Dir: "orgs/acme", Files: []Source{{URL: origin.URL, Name: "x.txt"}}})
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "may read but not write") {
		t.Fatalf("upload into the organization: %v", err)
	}
	if h, _ := repos.Head(ctx, org, repo.MainBranch); h != orgCommit {
		t.Fatal("the organization's main moved")
	}

	big := bytes.Repeat([]byte("b"), 4<<10)
	if _, _, err := repos.CommitFiles(ctx, member, repo.MainBranch, []repo.File{repo.BytesFile("big.txt", big)}, "big", repo.Signature{}); err != nil {
		t.Fatal(err)
	}
	_, err = svc.Read(ctx, member, "big.txt")
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.HasPrefix(err.Error(), "File is larger than 1 KiB (4.0 KiB)") {
		t.Fatalf("read past the limit: %v", err)
	}
}
