package persist

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// newSnapshotID returns "snap_" and 26 random base32 characters.
func newSnapshotID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "snap_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}
