package cluster

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"
)

// Headers of a forwarded request. The signature covers the others and
// the request line, so none can be changed or moved to another request;
// the time bounds a replay to MaxSkew.
const (
	HeaderNode      = "Sandboxd-Node"      // the forwarding node's id
	HeaderKeyID     = "Sandboxd-Key-Id"    // the caller's API key, by id
	HeaderPlaced    = "Sandboxd-Placed"    // "1": a create placed on the receiving node
	HeaderTime      = "Sandboxd-Time"      // unix milliseconds
	HeaderSignature = "Sandboxd-Signature" // hex HMAC-SHA256 of the above
)

// MaxSkew is how far a forwarded request's time may be from the receiving
// node's clock (nodes keep time with NTP).
const MaxSkew = 30 * time.Second

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 32

// ErrNotForwarded: the request carries no forwarding headers.
var ErrNotForwarded = errors.New("not a forwarded request")

// Secret is the cluster's shared secret, the same on every node.
type Secret []byte

// LoadSecret reads the secret from path (surrounding whitespace ignored).
func LoadSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster secret: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinSecretBytes {
		return nil, fmt.Errorf("cluster secret in %s: %d bytes, want at least %d (e.g. openssl rand -hex 32)", path, len(b), MinSecretBytes)
	}
	return Secret(b), nil
}

// Forward is what a forwarded request says about itself.
type Forward struct {
	From   string // the forwarding node
	KeyID  string // the caller's key
	Placed bool   // a create the forwarding node placed here
}

// Sign adds f's headers and their signature to r, replacing any the
// request came with.
func (s Secret) Sign(r *http.Request, f Forward, now time.Time) {
	r.Header.Set(HeaderNode, f.From)
	r.Header.Set(HeaderKeyID, f.KeyID)
	if f.Placed {
		r.Header.Set(HeaderPlaced, "1")
	} else {
		r.Header.Del(HeaderPlaced)
	}
	r.Header.Set(HeaderTime, strconv.FormatInt(now.UnixMilli(), 10))
	r.Header.Set(HeaderSignature, s.mac(r))
}

// Verify checks r's forwarding headers and returns what they say; a
// request without them is ErrNotForwarded.
func (s Secret) Verify(r *http.Request, now time.Time) (Forward, error) {
	sig := r.Header.Get(HeaderSignature)
	if sig == "" {
		return Forward{}, ErrNotForwarded
	}
	for _, h := range []string{HeaderNode, HeaderKeyID, HeaderPlaced, HeaderTime, HeaderSignature} {
		if len(r.Header.Values(h)) > 1 {
			return Forward{}, fmt.Errorf("forwarded request: %s given twice", h)
		}
	}
	want, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(want, s.macBytes(r)) {
		return Forward{}, errors.New("forwarded request: bad signature")
	}
	ms, err := strconv.ParseInt(r.Header.Get(HeaderTime), 10, 64)
	if err != nil {
		return Forward{}, errors.New("forwarded request: bad time")
	}
	if d := now.Sub(time.UnixMilli(ms)); d > MaxSkew || d < -MaxSkew {
		return Forward{}, fmt.Errorf("forwarded request: its time is %v from this node's (more than %v: clocks out of sync, or a replay)", d.Round(time.Second), MaxSkew)
	}
	f := Forward{From: r.Header.Get(HeaderNode), KeyID: r.Header.Get(HeaderKeyID), Placed: r.Header.Get(HeaderPlaced) == "1"}
	if f.From == "" || f.KeyID == "" {
		return Forward{}, errors.New("forwarded request: no node or key")
	}
	return f, nil
}

func (s Secret) mac(r *http.Request) string { return hex.EncodeToString(s.macBytes(r)) }

func (s Secret) macBytes(r *http.Request) []byte {
	m := hmac.New(sha256.New, s)
	// Fields end with a newline and none can hold one (header values and
	// the request line cannot), so the message parses one way only.
	for _, v := range []string{r.Method, r.URL.RequestURI(), r.Header.Get(HeaderNode), r.Header.Get(HeaderKeyID),
		r.Header.Get(HeaderPlaced), r.Header.Get(HeaderTime)} {
		m.Write([]byte(v))
		m.Write([]byte{'\n'})
	}
	return m.Sum(nil)
}
