package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// uploadBench is the file service of one account with a repository quota
// of 8 MiB, its reservations in the database, behind API servers with
// the deadlines a test asks for.
type uploadBench struct {
	t     *testing.T
	st    *store.Store
	files *files.Service
	tmp   string
	key   string
}

const mib = 1 << 20

func newUploadBench(t *testing.T) *uploadBench {
	t.Helper()
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
	repos, err := repo.New(repo.Options{Root: filepath.Join(t.TempDir(), "repos"), Limits: repo.Limits{QuotaBytes: 8 * mib}})
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), "tmp")
	svc, err := files.New(files.Options{Repos: repos, Fetcher: fetch.New(fetch.Options{}), PublicURL: "http://127.0.0.1:1", TempDir: tmp, Reservations: st})
	if err != nil {
		t.Fatal(err)
	}
	return &uploadBench{t: t, st: st, files: svc, tmp: tmp, key: key}
}

// serve is the API on a real listener (deadlines are the connection's)
// with the given body deadlines.
func (b *uploadBench) serve(idle, total time.Duration) *httptest.Server {
	srv, err := api.New(api.Options{Store: b.st, Auth: auth.NewAuthenticator(b.st), Version: "test", Files: b.files,
		BodyIdleTimeout: idle, BodyTimeout: total})
	if err != nil {
		b.t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	b.t.Cleanup(ts.Close)
	return ts
}

// answer is an upload's response.
type answer struct {
	status int
	err    string
}

// post sends an upload whose body is body (with its content type) and
// answers on the returned channel.
func (b *uploadBench) post(ts *httptest.Server, contentType string, body io.Reader) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", ts.URL+"/api/sandboxes/files", body)
		req.Header.Set("x-api-key", b.key)
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err.Error()}
			return
		}
		defer resp.Body.Close()
		var out struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&out)
		done <- answer{resp.StatusCode, out.Error}
	}()
	return done
}

// stall starts a multipart upload of one file whose client sends sent
// bytes and then nothing; closing the returned writer with an error is
// the client going away.
func (b *uploadBench) stall(ts *httptest.Server, sent int) (<-chan answer, *io.PipeWriter) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := b.post(ts, mw.FormDataContentType(), pr)
	go func() {
		part, err := mw.CreateFormFile("file", "stalled.bin")
		if err == nil {
			_, _ = part.Write(bytes.Repeat([]byte{'s'}, sent))
		}
	}()
	return done, pw
}

// whole is a complete multipart upload of one file of size bytes.
func (b *uploadBench) whole(ts *httptest.Server, name string, size int) answer {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	part, _ := mw.CreateFormFile("file", name)
	_, _ = part.Write(bytes.Repeat([]byte{'w'}, size))
	_ = mw.Close()
	return <-b.post(ts, mw.FormDataContentType(), &body)
}

// waitFor polls cond until it holds.
func (b *uploadBench) waitFor(what string, cond func() bool) {
	b.t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.t.Fatalf("still waiting for %s", what)
		}
	}
}

// spooled is what the uploads' temporary files take.
func (b *uploadBench) spooled() int64 {
	var n int64
	entries, _ := os.ReadDir(b.tmp)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}

// reserved counts the uploads holding room.
func (b *uploadBench) reserved() int {
	var n int
	if err := b.st.DB().QueryRow("SELECT COUNT(*) FROM upload_reservations").Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// TestConcurrentUploadsThroughTheAPI: multipart uploads that stall with
// their parts spooled hold room of the account's quota, and others past
// that room are refused at once with 429 saying so; the room comes back
// when a stalled client goes away.
func TestConcurrentUploadsThroughTheAPI(t *testing.T) {
	securitytest.Attack(t, "api",
		"a tenant starts a multipart upload that stalls holding 5 MiB under an 8 MiB repository quota, then two more uploads, then drops the stalled one",
		"the others are refused at once with 429 naming the quota and what the upload in flight holds; the stalled upload's room is released when its client goes away, and a 7 MiB upload fits again")
	b := newUploadBench(t)
	ts := b.serve(0, 0)
	stalled, client := b.stall(ts, 5*mib)
	b.waitFor("the stalled upload's part", func() bool { return b.spooled() >= 5*mib })
	for _, name := range []string{"second.bin", "third.bin"} {
		a := b.whole(ts, name, 1<<10)
		if a.status != http.StatusTooManyRequests || !strings.HasPrefix(a.err, "Upload refused: the repository would pass its storage quota of 8 MiB (0 bytes used, ") ||
			!strings.HasSuffix(a.err, " held by 1 other upload in flight); nothing was written") {
			t.Fatalf("%s while the stalled one holds the room: %+v", name, a)
		}
	}
	client.CloseWithError(io.ErrUnexpectedEOF)
	<-stalled
	b.waitFor("the room released", func() bool { return b.reserved() == 0 })
	if a := b.whole(ts, "fits.bin", 7*mib); a.status != http.StatusOK {
		t.Fatalf("an upload within the quota after the stalled one went: %+v", a)
	}
}

// TestUploadBodyDeadlines: a body that sends nothing for the idle
// deadline, or trickles past the whole one, is cut off with 408 and the
// upload's room released.
func TestUploadBodyDeadlines(t *testing.T) {
	securitytest.Attack(t, "api",
		"a client stalls a multipart upload after its first MiB, and another trickles a JSON body a byte at a time, to hold the server's connection and spooled bytes",
		"the stalled body is cut off at the idle deadline and the trickling one at the whole body's deadline: both 408 saying which, and the upload's reservation released")
	b := newUploadBench(t)
	stalled, _ := b.stall(b.serve(100*time.Millisecond, -1), mib)
	if a := <-stalled; a.status != http.StatusRequestTimeout || a.err != "Request body timed out: nothing arrived for 100ms" {
		t.Fatalf("a stalled body: %+v", a)
	}
	b.waitFor("the room released", func() bool { return b.reserved() == 0 })

	pr, pw := io.Pipe()
	trickled := b.post(b.serve(-1, 300*time.Millisecond), "application/json", pr)
	go func() {
		defer pw.Close()
		for _, c := range []byte(`{"files":[{"url":"http://127.0.0.1:1/x","name":"x"}]}` + strings.Repeat(" ", 1<<20)) {
			if _, err := pw.Write([]byte{c}); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if a := <-trickled; a.status != http.StatusRequestTimeout || a.err != "Request body timed out: it had not all arrived after 300ms" {
		t.Fatalf("a trickling body: %+v", a)
	}
	pr.CloseWithError(io.ErrClosedPipe)
}
