// Package host is the host side that every sandbox backend shares, in the
// way Nomad's drivers share drivers/shared: the state directory (ids/
// links and sandboxes/<cid>/, the atomic claim of an id, the scan an
// earlier process's sandboxes are reattached from), id validation, new
// container ids, limit defaults, and the operations served through the
// guest agent (Ops, embedded by each backend's sandbox). A backend keeps
// only what really differs: how it boots, reaches its agent, quiesces,
// exports its layer, measures itself and stops.
package host

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidID reports whether id is a valid sandbox id (runtime.Spec.ID).
func ValidID(id string) bool { return idPattern.MatchString(id) }

// NewCID is a new container id: prefix and 16 random hex digits.
func NewCID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Limits fills the zero fields of l from defaults.
func Limits(l, defaults runtime.Limits) runtime.Limits {
	if l.CPUs == 0 {
		l.CPUs = defaults.CPUs
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = defaults.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = defaults.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = defaults.DiskBytes
	}
	return l
}
