package templates

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/oci"
)

func TestSealedCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	key, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || !bytes.Equal(key, again) {
		t.Fatalf("the key is not read back: %v", err)
	}
	s, err := newSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	c := oci.Credentials{Username: "u", Password: "pw-sealed-123"}
	sealed, err := s.seal("tpl_a", c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "pw-sealed-123") || !strings.HasPrefix(sealed, sealedPrefix) {
		t.Fatalf("sealed: %q", sealed)
	}
	if got, err := s.open("tpl_a", sealed); err != nil || got != c {
		t.Fatalf("open: %v %v", got, err)
	}
	tok := oci.Credentials{RegistryToken: "tok-sealed-456"}
	if sealedTok, err := s.seal("tpl_t", tok); err != nil || strings.Contains(sealedTok, "tok-sealed-456") {
		t.Fatalf("seal a token: %v %q", err, sealedTok)
	} else if got, err := s.open("tpl_t", sealedTok); err != nil || got != tok {
		t.Fatalf("open a token: %v %v", got, err)
	}
	if other, _ := s.seal("tpl_a", c); other == sealed {
		t.Fatal("two seals of the same credentials are equal: the nonce is not random")
	}
	if _, err := s.open("tpl_b", sealed); err == nil {
		t.Fatal("another template's sealed credentials open")
	}
	otherKey, _ := LoadOrCreateKey(filepath.Join(t.TempDir(), "key"))
	o, _ := newSealer(otherKey)
	if _, err := o.open("tpl_a", sealed); err == nil {
		t.Fatal("another key opens them")
	}
	if _, err := s.open("tpl_a", sealed[:len(sealed)-4]+"AAA="); err == nil {
		t.Fatal("a changed value opens")
	}

	// A cluster's nodes make the same key from the same secret.
	k1, k2 := KeyFromSecret([]byte("cluster-secret-0123456789abcdef0123")), KeyFromSecret([]byte("cluster-secret-0123456789abcdef0123"))
	if !bytes.Equal(k1, k2) || len(k1) != KeyBytes || bytes.Equal(k1, KeyFromSecret([]byte("another-secret-0123456789abcdef012"))) {
		t.Fatal("KeyFromSecret is not a function of the secret alone")
	}
	n1, _ := newSealer(k1)
	n2, _ := newSealer(k2)
	if v, err := n1.seal("tpl_c", c); err != nil {
		t.Fatal(err)
	} else if got, err := n2.open("tpl_c", v); err != nil || got != c {
		t.Fatalf("another node opens: %v %v", got, err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("a key file readable by others: %v", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(short); err == nil {
		t.Fatal("a short key file is taken")
	}
}
