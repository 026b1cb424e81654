// Package fetch downloads files from URLs that users supply, without letting
// them reach what the server can reach and they should not.
//
// Invariants:
//   - Only http and https URLs are fetched, also after redirects (at most
//     MaxRedirects of them).
//   - A host name is resolved once per connection and the connection is
//     dialled to the very address that was checked, so a DNS answer that
//     changes between check and use (DNS rebinding) cannot bypass the check;
//     the dialer's Control hook checks the address again at connect time.
//   - Private, loopback, link-local, shared (CGNAT), unspecified, multicast,
//     reserved and cloud metadata addresses are refused; Options.AllowPrivate
//     lifts the refusal for the first four only. Metadata endpoints are
//     refused whatever the options.
//   - Dialer, the guard that does this, is exported: other packages that
//     connect on a user's behalf (package oci, to registries) use it, so
//     the rules live in one place.
//   - A download never writes more than MaxBytes and never runs longer than
//     Timeout. Environment proxies are ignored: a proxy would make the
//     address checks meaningless.
package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxBytes      = 100 << 20
	DefaultTimeout       = 60 * time.Second
	DefaultMaxRedirects  = 5
	DefaultProgressEvery = 16 << 20
)

// Resolver looks up the addresses of a host; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Fetcher. The zero value is the safe default.
type Options struct {
	// MaxBytes caps each download (default 100 MiB).
	MaxBytes int64
	// Timeout caps each download from request to last byte (default 60 s).
	Timeout time.Duration
	// MaxRedirects caps redirects followed per download (default 5).
	MaxRedirects int
	// AllowPrivate allows private, loopback, link-local and CGNAT
	// addresses (the server's --allow-private-downloads).
	AllowPrivate bool
	// Allow lists prefixes allowed whatever their class, except metadata
	// endpoints.
	Allow []netip.Prefix
	// ProgressEvery logs the progress of a download every so many bytes
	// (default 16 MiB); downloads smaller than that log nothing.
	ProgressEvery int64
	// Resolver resolves host names (default net.DefaultResolver).
	Resolver Resolver
	// UserAgent is sent with every request (default "sandboxd-fetch").
	UserAgent string
	Logger    *slog.Logger
}

// Fetcher downloads URLs under Options. It is safe for concurrent use.
type Fetcher struct {
	opts   Options
	dialer *Dialer
	client *http.Client
	log    *slog.Logger
}

// New returns a Fetcher with opts, defaults filled in.
func New(opts Options) *Fetcher {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxRedirects <= 0 {
		opts.MaxRedirects = DefaultMaxRedirects
	}
	if opts.ProgressEvery <= 0 {
		opts.ProgressEvery = DefaultProgressEvery
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.UserAgent == "" {
		opts.UserAgent = "sandboxd-fetch"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fetcher{
		opts:   opts,
		dialer: &Dialer{Policy: Policy{AllowPrivate: opts.AllowPrivate, Allow: opts.Allow}, Resolver: opts.Resolver},
		log:    opts.Logger,
	}
	transport := &http.Transport{
		Proxy:                 nil, // never: a proxy would dial for us, unchecked
		DialContext:           f.dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
		// The bytes the URL serves are the file: no transparent gunzip,
		// which would also open the door to decompression bombs.
		DisableCompression: true,
	}
	f.client = &http.Client{Transport: transport, CheckRedirect: f.checkRedirect}
	return f
}

// MaxBytes is the size cap of one download.
func (f *Fetcher) MaxBytes() int64 { return f.opts.MaxBytes }

// Result describes a finished download.
type Result struct {
	// Size is the number of bytes written.
	Size int64
	// ContentType is the server's Content-Type, if any.
	ContentType string
	// URL is the final URL after redirects.
	URL string
}

// Errors of Fetch; Reason turns them into words for users.
var (
	ErrScheme           = errors.New("only http and https URLs are allowed")
	ErrInvalidURL       = errors.New("invalid URL")
	ErrTooManyRedirects = errors.New("too many redirects")
	ErrHostNotFound     = errors.New("host not found")
)

// TooLargeError reports a download over the size cap.
type TooLargeError struct{ Limit int64 }

func (e *TooLargeError) Error() string { return "larger than " + FormatSize(e.Limit) }

// TimeoutError reports a download that did not finish within the time cap.
type TimeoutError struct{ Limit time.Duration }

func (e *TimeoutError) Error() string {
	return "timed out after " + strconv.FormatFloat(e.Limit.Seconds(), 'f', -1, 64) + " s"
}

// StatusError reports a response that was not 2xx.
type StatusError struct{ Code int }

func (e *StatusError) Error() string { return "HTTP " + strconv.Itoa(e.Code) }

// Fetch downloads rawURL into w. On error, w may have received part of the
// body; callers that keep the bytes write to a temporary file.
func (f *Fetcher) Fetch(ctx context.Context, rawURL string, w io.Writer) (Result, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return Result{}, err
	}
	if err := f.checkHost(u); err != nil {
		return Result{}, err
	}
	tctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	res, err := f.fetch(tctx, u, w)
	if err != nil && errors.Is(tctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return res, &TimeoutError{Limit: f.opts.Timeout}
	}
	return res, err
}

func (f *Fetcher) fetch(ctx context.Context, u *url.URL, w io.Writer) (Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	req.Header.Set("User-Agent", f.opts.UserAgent)
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := f.client.Do(req)
	if err != nil {
		return Result{}, unwrapURLError(err)
	}
	defer resp.Body.Close()
	res := Result{ContentType: resp.Header.Get("Content-Type"), URL: resp.Request.URL.String()}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return res, &StatusError{Code: resp.StatusCode}
	}
	if resp.ContentLength > f.opts.MaxBytes {
		return res, &TooLargeError{Limit: f.opts.MaxBytes}
	}
	pw := &progressWriter{w: w, every: f.opts.ProgressEvery, next: f.opts.ProgressEvery,
		total: resp.ContentLength, url: redact(resp.Request.URL), log: f.log, ctx: ctx, start: time.Now()}
	// One byte over the cap tells a file of exactly MaxBytes from a larger one.
	n, err := io.Copy(pw, io.LimitReader(resp.Body, f.opts.MaxBytes+1))
	res.Size = n
	if err != nil {
		return res, fmt.Errorf("read body of %s: %w", redact(resp.Request.URL), err)
	}
	if n > f.opts.MaxBytes {
		res.Size = f.opts.MaxBytes
		return res, &TooLargeError{Limit: f.opts.MaxBytes}
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return res, fmt.Errorf("read body of %s: got %d of %d bytes: %w", redact(resp.Request.URL), n, resp.ContentLength, io.ErrUnexpectedEOF)
	}
	pw.finish()
	return res, nil
}

func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, ErrScheme
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%w: no host", ErrInvalidURL)
	}
	return u, nil
}

func (f *Fetcher) checkHost(u *url.URL) error { return f.dialer.CheckHost(u.Hostname()) }

func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.opts.MaxRedirects {
		return ErrTooManyRedirects
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return ErrScheme
	}
	return f.checkHost(req.URL)
}

// Dialer connects only to addresses its Policy allows: it resolves a host
// name once, checks every address and dials the first allowed one by IP,
// so the connection goes where the check looked (a DNS answer that changes
// in between, DNS rebinding, changes nothing); its Control hook checks the
// address again at connect time. Other packages that connect on a user's
// behalf (registries) dial with it, so there is one address guard.
type Dialer struct {
	Policy Policy
	// Resolver resolves host names (nil: net.DefaultResolver).
	Resolver Resolver
	// Timeout bounds one connection attempt (0: 15 s).
	Timeout time.Duration
}

// CheckHost refuses an IP-literal host before any connection is tried,
// for a clear error; names are checked when dialled.
func (d *Dialer) CheckHost(host string) error {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	return d.Policy.Check(ip)
}

// DialContext is net.Dialer's DialContext, refusing what Policy refuses
// with an *AddressError.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dial %s: bad port: %w", addr, err)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		var res Resolver = net.DefaultResolver
		if d.Resolver != nil {
			res = d.Resolver
		}
		ips, err = res.LookupNetIP(ctx, "ip", host)
		if err != nil {
			var dnsErr *net.DNSError
			if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
				return nil, fmt.Errorf("resolve %s: %w", host, ErrHostNotFound)
			}
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		if len(ips) == 0 {
			return nil, fmt.Errorf("resolve %s: %w", host, ErrHostNotFound)
		}
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	nd := &net.Dialer{Timeout: timeout, Control: d.control}
	var firstErr error
	for _, ip := range ips {
		if err := d.Policy.Check(ip); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		conn, err := nd.DialContext(ctx, network, netip.AddrPortFrom(ip.Unmap(), uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if firstErr == nil || errors.Is(firstErr, ErrAddressNotAllowed) {
			firstErr = err
		}
	}
	return nil, firstErr
}

// control checks the address the socket is about to connect to: the last
// line of defence should anything dial without going through DialContext.
func (d *Dialer) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", address, err)
	}
	return d.Policy.Check(ap.Addr())
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the URL
// (which may carry credentials in its query).
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Reason says in a few words why a download failed, for users: "address
// not allowed", "HTTP 404", "larger than 100 MiB", ...
func Reason(err error) string {
	var (
		tooLarge *TooLargeError
		timeout  *TimeoutError
		status   *StatusError
		netErr   net.Error
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAddressNotAllowed):
		return "address not allowed"
	case errors.As(err, &tooLarge):
		return tooLarge.Error()
	case errors.As(err, &timeout):
		return timeout.Error()
	case errors.As(err, &status):
		return status.Error()
	case errors.Is(err, ErrScheme):
		return ErrScheme.Error()
	case errors.Is(err, ErrTooManyRedirects):
		return ErrTooManyRedirects.Error()
	case errors.Is(err, ErrHostNotFound):
		return ErrHostNotFound.Error()
	case errors.Is(err, ErrInvalidURL):
		return ErrInvalidURL.Error()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed before the whole file arrived"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "connection timed out"
	}
	return "download failed"
}

// redact drops credentials and the query (which often carries tokens) from
// a URL for logs.
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	c.Fragment = ""
	return c.String()
}

// FormatSize writes a byte count the way limits are quoted to users:
// "100 MiB", "1 GiB", "1000 bytes".
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// progressWriter logs a download's progress every so many bytes, so that a
// large download shows in the logs while it runs.
type progressWriter struct {
	w      io.Writer
	n      int64
	every  int64
	next   int64
	total  int64
	url    string
	log    *slog.Logger
	ctx    context.Context
	start  time.Time
	logged bool
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	for p.n >= p.next {
		p.log.InfoContext(p.ctx, "download progress", "url", p.url, "bytes", p.n, "total", p.total,
			"elapsed", time.Since(p.start).Round(time.Millisecond))
		p.next += p.every
		p.logged = true
	}
	return n, err
}

func (p *progressWriter) finish() {
	if p.logged {
		p.log.InfoContext(p.ctx, "download finished", "url", p.url, "bytes", p.n,
			"elapsed", time.Since(p.start).Round(time.Millisecond))
	}
}
