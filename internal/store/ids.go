package store

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// NewID is a new row id: prefix ("sbx_", "run_", "snap_") and 26 random
// lower-case base32 characters (128 bits).
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// ReasonTimeout is the stop reason of a sandbox that reached its deadline;
// a run cut by it reports the timeout.
const ReasonTimeout = "timeout"
