package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// server is a loopback HTTP server that counts the requests it receives, so
// tests can prove a refused address was never contacted.
type server struct {
	*httptest.Server
	hits atomic.Int64
}

func newServer(t *testing.T, addr string, h http.HandlerFunc) *server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func serveBytes(data []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(data)
	}
}

func redirectTo(target string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, target, http.StatusFound) }
}

var allow2 = []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}

func TestFetchLoopback(t *testing.T) {
	payload := append([]byte("\x89PNG\r\n\x1a\n\x00\x00binary"), bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)...)
	srv := newServer(t, "127.0.0.1:0", serveBytes(payload))

	t.Run("refused by default", func(t *testing.T) {
		var buf bytes.Buffer
		_, err := New(Options{}).Fetch(context.Background(), srv.URL+"/f.png", &buf)
		if !errors.Is(err, ErrAddressNotAllowed) {
			t.Fatalf("err = %v, want address not allowed", err)
		}
		if Reason(err) != "address not allowed" {
			t.Fatalf("Reason = %q", Reason(err))
		}
		if srv.hits.Load() != 0 || buf.Len() != 0 {
			t.Fatalf("server was contacted (%d hits, %d bytes)", srv.hits.Load(), buf.Len())
		}
	})
	t.Run("localhost refused by default", func(t *testing.T) {
		u := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
		_, err := New(Options{}).Fetch(context.Background(), u, io.Discard)
		if !errors.Is(err, ErrAddressNotAllowed) {
			t.Fatalf("err = %v, want address not allowed", err)
		}
	})
	t.Run("allowed with AllowPrivate", func(t *testing.T) {
		var buf bytes.Buffer
		res, err := New(Options{AllowPrivate: true}).Fetch(context.Background(), srv.URL+"/f.png", &buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), payload) || res.Size != int64(len(payload)) {
			t.Fatalf("got %d bytes (size %d), want %d exact", buf.Len(), res.Size, len(payload))
		}
		if res.ContentType != "application/octet-stream" || res.URL != srv.URL+"/f.png" {
			t.Fatalf("result %+v", res)
		}
	})
}

func TestFetchRedirects(t *testing.T) {
	// The origin listens on 127.0.0.2, allowed by an allow-list; 127.0.0.1
	// stays refused. That is how a redirect to a refused loopback address
	// can be tested without AllowPrivate.
	target := newServer(t, "127.0.0.1:0", serveBytes([]byte("secret")))
	ok := newServer(t, "127.0.0.2:0", serveBytes([]byte("fine")))
	port := strconv.Itoa(target.Listener.Addr().(*net.TCPAddr).Port)
	cases := []struct {
		name     string
		location string
		opts     Options
		want     error
	}{
		{"to 127.0.0.1", target.URL + "/x", Options{Allow: allow2}, ErrAddressNotAllowed},
		{"to localhost", "http://localhost:" + port + "/x", Options{Allow: allow2}, ErrAddressNotAllowed},
		{"to [::ffff:127.0.0.1]", "http://[::ffff:127.0.0.1]:" + port + "/x", Options{Allow: allow2}, ErrAddressNotAllowed},
		{"to metadata", "http://169.254.169.254/latest/meta-data/", Options{AllowPrivate: true}, ErrAddressNotAllowed},
		{"to metadata v6", "http://[fd00:ec2::254]/latest/meta-data/", Options{AllowPrivate: true}, ErrAddressNotAllowed},
		{"to file", "file:///etc/passwd", Options{AllowPrivate: true}, ErrScheme},
		{"to ftp", "ftp://127.0.0.2/x", Options{AllowPrivate: true}, ErrScheme},
		{"to allowed", ok.URL + "/y", Options{Allow: allow2}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			origin := newServer(t, "127.0.0.2:0", redirectTo(tc.location))
			before := target.hits.Load()
			var buf bytes.Buffer
			_, err := New(tc.opts).Fetch(context.Background(), origin.URL+"/start", &buf)
			if tc.want == nil {
				if err != nil || buf.String() != "fine" {
					t.Fatalf("got %q, %v", buf.String(), err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if origin.hits.Load() != 1 || target.hits.Load() != before {
				t.Fatalf("hits: origin %d, refused target %d", origin.hits.Load(), target.hits.Load()-before)
			}
		})
	}
}

func TestFetchRedirectLimit(t *testing.T) {
	// /n redirects to /n-1; /0 serves the file.
	srv := newServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if n == 0 {
			_, _ = io.WriteString(w, "done")
			return
		}
		http.Redirect(w, r, "/"+strconv.Itoa(n-1), http.StatusFound)
	})
	f := New(Options{AllowPrivate: true})
	var buf bytes.Buffer
	if _, err := f.Fetch(context.Background(), srv.URL+"/5", &buf); err != nil || buf.String() != "done" {
		t.Fatalf("5 redirects: %q, %v", buf.String(), err)
	}
	_, err := f.Fetch(context.Background(), srv.URL+"/6", io.Discard)
	if !errors.Is(err, ErrTooManyRedirects) || Reason(err) != "too many redirects" {
		t.Fatalf("6 redirects: %v", err)
	}
}

func TestFetchSizeCap(t *testing.T) {
	const limit = 1000
	cases := []struct {
		name    string
		size    int
		chunked bool
		tooBig  bool
	}{
		{"exactly the cap", limit, false, false},
		{"one over, with length", limit + 1, false, true},
		{"one over, chunked", limit + 1, true, true},
		{"far over, chunked", 50 * limit, true, true},
		{"exactly the cap, chunked", limit, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("x"), tc.size)
			srv := newServer(t, "127.0.0.1:0", func(w http.ResponseWriter, _ *http.Request) {
				if !tc.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				}
				for i := 0; i < len(data); i += 100 {
					_, _ = w.Write(data[i:min(i+100, len(data))])
					if tc.chunked {
						w.(http.Flusher).Flush()
					}
				}
			})
			var buf bytes.Buffer
			res, err := New(Options{AllowPrivate: true, MaxBytes: limit}).Fetch(context.Background(), srv.URL, &buf)
			if tc.tooBig {
				var tl *TooLargeError
				if !errors.As(err, &tl) || Reason(err) != "larger than 1000 bytes" {
					t.Fatalf("err = %v (%q), want too large", err, Reason(err))
				}
				if buf.Len() > limit+1 {
					t.Fatalf("wrote %d bytes past a cap of %d", buf.Len(), limit)
				}
				return
			}
			if err != nil || res.Size != int64(tc.size) || buf.Len() != tc.size {
				t.Fatalf("got %d bytes, %v", buf.Len(), err)
			}
		})
	}
	if got := (&TooLargeError{Limit: DefaultMaxBytes}).Error(); got != "larger than 100 MiB" {
		t.Fatalf("default cap reads %q", got)
	}
}

func TestFetchTimeout(t *testing.T) {
	cases := []struct {
		name string
		h    http.HandlerFunc
	}{
		{"no headers", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"slow body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, "127.0.0.1:0", tc.h)
			_, err := New(Options{AllowPrivate: true, Timeout: 200 * time.Millisecond}).Fetch(context.Background(), srv.URL, io.Discard)
			var te *TimeoutError
			if !errors.As(err, &te) || Reason(err) != "timed out after 0.2 s" {
				t.Fatalf("err = %v (%q), want timeout", err, Reason(err))
			}
		})
	}
	// A caller's cancellation is not reported as the download's timeout.
	srv := newServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := New(Options{AllowPrivate: true}).Fetch(ctx, srv.URL, io.Discard)
	var te *TimeoutError
	if err == nil || errors.As(err, &te) {
		t.Fatalf("err = %v, want the caller's deadline", err)
	}
}

func TestFetchStatus(t *testing.T) {
	srv := newServer(t, "127.0.0.1:0", http.NotFound)
	_, err := New(Options{AllowPrivate: true}).Fetch(context.Background(), srv.URL+"/missing", io.Discard)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 404 || Reason(err) != "HTTP 404" {
		t.Fatalf("err = %v", err)
	}
}

// fixedResolver answers every lookup with the same addresses and counts
// the lookups.
type fixedResolver struct {
	addrs []netip.Addr
	calls atomic.Int64
}

func (r *fixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.calls.Add(1)
	return r.addrs, nil
}

func TestFetchDialsCheckedAddress(t *testing.T) {
	srv := newServer(t, "127.0.0.2:0", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "host="+r.Host)
	})
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	url := "http://files.example.test:" + port + "/f"

	// A name that resolves to a refused address is refused.
	res := &fixedResolver{addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
	_, err := New(Options{Resolver: res}).Fetch(context.Background(), url, io.Discard)
	if !errors.Is(err, ErrAddressNotAllowed) || srv.hits.Load() != 0 {
		t.Fatalf("err = %v, hits %d", err, srv.hits.Load())
	}

	// Refused addresses among the answers are skipped; the connection goes
	// to the checked one, and the request still names the host.
	res = &fixedResolver{addrs: []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}}
	var buf bytes.Buffer
	_, err = New(Options{Resolver: res, Allow: allow2}).Fetch(context.Background(), url, &buf)
	if err != nil || buf.String() != "host=files.example.test:"+port {
		t.Fatalf("got %q, %v", buf.String(), err)
	}
	if res.calls.Load() != 1 {
		t.Fatalf("resolved %d times, want once", res.calls.Load())
	}
}

func TestFetchRejectsBadURLs(t *testing.T) {
	cases := []struct {
		url  string
		want error
	}{
		{"file:///etc/passwd", ErrScheme},
		{"gopher://example.com/", ErrScheme},
		{"javascript:alert(1)", ErrScheme},
		{"http://", ErrInvalidURL},
		{"http://%zz/", ErrInvalidURL},
		{"http://0.0.0.0:1/", ErrAddressNotAllowed},
		{"http://[::]:1/", ErrAddressNotAllowed},
		{"http://169.254.169.254/latest/meta-data/", ErrAddressNotAllowed},
		{"http://10.0.0.1/", ErrAddressNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			_, err := New(Options{}).Fetch(context.Background(), tc.url, io.Discard)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// recordHandler keeps the messages of log records.
type recordHandler struct{ msgs chan string }

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.msgs <- r.Message
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

func TestFetchLogsProgress(t *testing.T) {
	data := bytes.Repeat([]byte("y"), 10*1024)
	srv := newServer(t, "127.0.0.1:0", serveBytes(data))
	rec := recordHandler{msgs: make(chan string, 100)}
	f := New(Options{AllowPrivate: true, ProgressEvery: 1024, Logger: slog.New(rec)})
	if _, err := f.Fetch(context.Background(), srv.URL+"/big?token=secret", io.Discard); err != nil {
		t.Fatal(err)
	}
	close(rec.msgs)
	counts := map[string]int{}
	for m := range rec.msgs {
		counts[m]++
	}
	if counts["download progress"] != 10 || counts["download finished"] != 1 {
		t.Fatalf("log records %v", counts)
	}
	// A small download logs nothing.
	rec = recordHandler{msgs: make(chan string, 100)}
	f = New(Options{AllowPrivate: true, Logger: slog.New(rec)})
	if _, err := f.Fetch(context.Background(), srv.URL, io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(rec.msgs) != 0 {
		t.Fatalf("%d log records for a small download", len(rec.msgs))
	}
}

func TestReason(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{&AddressError{IP: netip.MustParseAddr("10.0.0.1"), Class: Private}, "address not allowed"},
		{fmt.Errorf("dial: %w", &AddressError{IP: netip.MustParseAddr("::1"), Class: Loopback}), "address not allowed"},
		{&StatusError{Code: 403}, "HTTP 403"},
		{&TooLargeError{Limit: 5 << 20}, "larger than 5 MiB"},
		{&TimeoutError{Limit: time.Minute}, "timed out after 60 s"},
		{fmt.Errorf("resolve x: %w", ErrHostNotFound), "host not found"},
		{ErrScheme, "only http and https URLs are allowed"},
		{ErrTooManyRedirects, "too many redirects"},
		{errors.New("something odd"), "download failed"},
	}
	for _, tc := range cases {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
