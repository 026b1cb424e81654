package auth

import (
	"regexp"
	"testing"
)

// The JavaScript SDKs 2.27 to 2.45 check keys against this pattern.
var e2bKeyPattern = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

func TestNewE2BKey(t *testing.T) {
	plaintext, prefix, hash, err := NewE2BKey()
	if err != nil {
		t.Fatal(err)
	}
	if !e2bKeyPattern.MatchString(plaintext) || len(plaintext) != len(E2BKeyPrefix)+64 {
		t.Fatalf("key %q is not in E2B's form", plaintext)
	}
	if prefix != plaintext[:len(prefix)] || len(prefix) != len(E2BKeyPrefix)+8 {
		t.Fatalf("prefix %q of %q", prefix, plaintext)
	}
	if hash != HashKey(plaintext) {
		t.Fatal("hash is not HashKey of the plaintext")
	}
	if again, _, _, _ := NewE2BKey(); again == plaintext {
		t.Fatal("two keys are the same")
	}
}
