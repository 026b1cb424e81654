// Package sealbox seals small secrets a server keeps in its database (a
// build's registry credentials, a webhook's signing secret) under a key of
// the server's, so that the database alone does not give them away:
// AES-256-GCM, bound to what the secret belongs to (additional data, such
// as the row's id: a sealed value copied to another row does not open),
// stored as "v1:" and base64 of the nonce and the ciphertext.
package sealbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// KeyBytes is the length of a key (AES-256).
const KeyBytes = 32

// prefix names the format of a sealed value.
const prefix = "v1:"

// ErrUnsealable: the value does not open with this key (another key, or
// another row's value).
var ErrUnsealable = errors.New("sealbox: the sealed value does not open with this server's key")

// Box seals and opens values under one key.
type Box struct{ aead cipher.AEAD }

// New is a Box of key, KeyBytes long.
func New(key []byte) (*Box, error) {
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("sealbox: the key has %d bytes, want %d", len(key), KeyBytes)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// Derive is a key for one use (label) made from a base key, so that the
// uses never share a key: HMAC-SHA256 of the label.
func Derive(base []byte, label string) []byte {
	m := hmac.New(sha256.New, base)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// Seal seals plain, bound to ad.
func (b *Box) Seal(ad string, plain []byte) (string, error) {
	nonce := make([]byte, b.aead.NonceSize(), b.aead.NonceSize()+len(plain)+b.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := b.aead.Seal(nonce, nonce, plain, []byte(ad))
	return prefix + base64.StdEncoding.EncodeToString(out), nil
}

// Open opens a value Seal made with the same key and ad; anything else is
// ErrUnsealable. The caller clears the plaintext when done with it.
func (b *Box) Open(ad, sealed string) ([]byte, error) {
	b64, ok := strings.CutPrefix(sealed, prefix)
	if !ok {
		return nil, ErrUnsealable
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < b.aead.NonceSize() {
		return nil, ErrUnsealable
	}
	plain, err := b.aead.Open(nil, raw[:b.aead.NonceSize()], raw[b.aead.NonceSize():], []byte(ad))
	if err != nil {
		return nil, ErrUnsealable
	}
	return plain, nil
}
