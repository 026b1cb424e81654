package cluster

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

var secret = Secret(strings.Repeat("s", 32))

func TestSignVerify(t *testing.T) {
	securitytest.Attack(t, "cluster", "a request to a node's cluster listener forged, altered, replayed late or signed with another secret",
		"refused: the HMAC covers the method, URI, node, key id, placement and time; the time must be within 30 s")
	now := time.Now()
	signed := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/sandboxes/sbx_1/exec?x=1", nil)
		secret.Sign(r, Forward{From: "n1", KeyID: "key_1"}, now)
		return r
	}
	if f, err := secret.Verify(signed(), now.Add(time.Second)); err != nil || f != (Forward{From: "n1", KeyID: "key_1"}) {
		t.Fatalf("a good signature: %+v %v", f, err)
	}
	if _, err := secret.Verify(httptest.NewRequest("GET", "/", nil), now); !errors.Is(err, ErrNotForwarded) {
		t.Fatalf("no headers: %v", err)
	}
	for name, tamper := range map[string]func(r *http.Request){
		"key id":    func(r *http.Request) { r.Header.Set(HeaderKeyID, "key_2") },
		"node":      func(r *http.Request) { r.Header.Set(HeaderNode, "n2") },
		"placed":    func(r *http.Request) { r.Header.Set(HeaderPlaced, "1") },
		"path":      func(r *http.Request) { r.URL.Path = "/api/sandboxes/sbx_2/exec" },
		"query":     func(r *http.Request) { r.URL.RawQuery = "x=2" },
		"method":    func(r *http.Request) { r.Method = "GET" },
		"time":      func(r *http.Request) { r.Header.Set(HeaderTime, fmt.Sprint(now.UnixMilli()+1)) },
		"signature": func(r *http.Request) { r.Header.Set(HeaderSignature, strings.Repeat("0", 64)) },
		"twice":     func(r *http.Request) { r.Header.Add(HeaderKeyID, "key_1") },
		"otherSecret": func(r *http.Request) {
			Secret(strings.Repeat("t", 32)).Sign(r, Forward{From: "n1", KeyID: "key_1"}, now)
		},
	} {
		r := signed()
		tamper(r)
		if _, err := secret.Verify(r, now); err == nil {
			t.Errorf("%s changed: accepted", name)
		}
	}
	if _, err := secret.Verify(signed(), now.Add(MaxSkew+time.Second)); err == nil {
		t.Error("a replay after the skew was accepted")
	}
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("too short\n"), 0o600)
	if _, err := LoadSecret(short); err == nil {
		t.Error("a short secret was accepted")
	}
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	if s, err := LoadSecret(good); err != nil || len(s) != 64 {
		t.Errorf("good secret: %d bytes, %v", len(s), err)
	}
}
