package files

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// stalledUpload is a multipart upload of one file whose client sent
// the first sent bytes of it and then stalls, until finish sends the rest.
type stalledUpload struct {
	done   chan error // the service's answer
	pw     *io.PipeWriter
	mw     *multipart.Writer
	rest   []byte
	closed chan struct{}
}

// startStalled starts an upload of size bytes through svc, the client
// sending the first sent of them; it returns once the service has read
// them.
func startStalled(t *testing.T, svc *Service, account, name string, size, sent int) *stalledUpload {
	t.Helper()
	pr, pw := io.Pipe()
	u := &stalledUpload{done: make(chan error, 1), pw: pw, mw: multipart.NewWriter(pw), closed: make(chan struct{})}
	go func() {
		_, _, err := svc.UploadMultipart(context.Background(), account, multipart.NewReader(pr, u.mw.Boundary()))
		// A client whose upload was answered stops sending.
		pr.CloseWithError(errors.New("answered"))
		u.done <- err
	}()
	data := bytes.Repeat([]byte{'u'}, size)
	u.rest = data[sent:]
	// The pipe hands the bytes over as the service reads them: once the
	// write returns, they were read. A write fails when the service
	// answered first (a refusal before reading).
	part, err := u.mw.CreateFormFile("file", name)
	if err == nil {
		_, err = part.Write(data[:sent])
	}
	if err != nil {
		t.Logf("upload %s: the service stopped reading: %v", name, err)
	}
	return u
}

// finish sends the rest of the file and ends the body.
func (u *stalledUpload) finish() error {
	if _, err := u.pw.Write(u.rest); err != nil {
		return err
	}
	if err := u.mw.Close(); err != nil {
		return err
	}
	return u.pw.Close()
}

// spooled is what the uploads' temporary files take.
func spooled(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}

// TestConcurrentUploadsShareTheQuota: uploads of one account at once, on
// two nodes sharing a database, spool together no more than the room its
// repository's quota has left. An upload past the room the others hold is
// refused (429) at once with both figures, and each upload's reservation
// is released however it ends, so that the room is there again.
func TestConcurrentUploadsShareTheQuota(t *testing.T) {
	securitytest.Attack(t, "storage quotas",
		"a tenant starts a multipart upload that stalls holding its spooled part, and another one of more than the quota's room, through another node of the cluster",
		"the uploads of an account at once reserve what they spool in the database every node shares: the second is refused (429, naming the quota and what uploads in flight hold) before the uploads together spool past the quota; the room is released when each ends")
	const mib = 1 << 20
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		st := storetest.Open(t, dsn)
		root := filepath.Join(t.TempDir(), "repos")
		node := func() (*Service, string) {
			repos, err := repo.New(repo.Options{Root: root, Limits: repo.Limits{QuotaBytes: 8 * mib}})
			if err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(t.TempDir(), "tmp")
			svc, err := New(Options{Repos: repos, Fetcher: fetch.New(fetch.Options{}), PublicURL: "http://127.0.0.1:1", TempDir: tmp, Reservations: st})
			if err != nil {
				t.Fatal(err)
			}
			return svc, tmp
		}
		one, tmpOne := node()
		two, tmpTwo := node()
		account := uuid.NewString()

		stalled := startStalled(t, one, account, "a.bin", 2*mib, 2*mib)
		big := startStalled(t, two, account, "b.bin", 7*mib, 0)
		// The second upload's client sends its file; the node stops
		// reading at its share (or, without a shared reservation, spools
		// it whole and waits for the end of the body, past the quota).
		go func() { _, _ = big.pw.Write(big.rest) }()
		var err error
		for err == nil {
			select {
			case err = <-big.done:
			default:
				if n := spooled(t, tmpOne) + spooled(t, tmpTwo); n > 8*mib {
					t.Fatalf("the uploads spool %d bytes, past the quota of 8 MiB", n)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if !errors.Is(err, errdefs.ErrQuota) || !strings.HasPrefix(err.Error(), "Upload refused: the repository would pass its storage quota of 8 MiB (0 bytes used, ") ||
			!strings.HasSuffix(err.Error(), " held by 1 other upload in flight); nothing was written") {
			t.Fatalf("the upload past the room: %v", err)
		}
		if n := spooled(t, tmpTwo); n != 0 {
			t.Fatalf("the refused upload left %d bytes", n)
		}
		// The stalled one carries on and is committed; the room comes back.
		if err := stalled.finish(); err != nil {
			t.Fatal(err)
		}
		if err := <-stalled.done; err != nil {
			t.Fatalf("the first upload: %v", err)
		}
		again := startStalled(t, two, account, "c.bin", 5*mib, 5*mib)
		if err := again.finish(); err != nil {
			t.Fatal(err)
		}
		if err := <-again.done; err != nil {
			t.Fatalf("an upload within the room once the others ended: %v", err)
		}
	})
}

// TestLocalReservations: without a database, the reservations of one
// Service's uploads share the quota as the database's do.
func TestLocalReservations(t *testing.T) {
	const mib = 1 << 20
	svc, _ := limitedService(t, filepath.Join(t.TempDir(), "repos"), repo.Limits{QuotaBytes: 8 * mib}, nil)
	account := uuid.NewString()
	first := startStalled(t, svc, account, "a.bin", 5*mib, 5*mib)
	second := startStalled(t, svc, account, "b.bin", 1, 0)
	if err := <-second.done; !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "(0 bytes used, 8.0 MiB held by 1 other upload in flight)") {
		t.Fatalf("an upload while another holds the room: %v", err)
	}
	first.pw.CloseWithError(errors.New("client gone"))
	if err := <-first.done; err == nil {
		t.Fatal("a broken upload succeeded")
	}
	third := startStalled(t, svc, account, "c.bin", 7*mib, 7*mib)
	if err := third.finish(); err != nil {
		t.Fatal(err)
	}
	if err := <-third.done; err != nil {
		t.Fatalf("after a broken upload released its room: %v", err)
	}

	l := newLocalReservations()
	r := store.UploadReservation{ID: "a", AccountID: account, Need: 1, Want: 10, Limit: 4, TTL: reservationTTL}
	if g, err := l.ReserveUpload(t.Context(), r); err != nil || g.Bytes != 4 {
		t.Fatalf("grant of what fits: %+v, %v", g, err)
	}
	r.ID = "b"
	if _, err := l.ReserveUpload(t.Context(), r); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("past the limit: %v", err)
	}
}
