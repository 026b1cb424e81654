package templatespec

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strconv"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// keyVersion is mixed into every key: change it when the encoding below or
// the meaning of a step changes, and every old cache entry stops matching.
const keyVersion = "sandboxd template step key v1"

// CacheKeys names the result of each step: keys[i] is the SHA-256, hex, of
// keys[i-1] (for the first step: of baseDigest) and of step i's content, so
// it covers the base's digest, every step up to i and, for a COPY, the
// content hash of its files. A rebuild that changes only the last step finds
// every earlier key unchanged and reuses their layers.
//
// baseDigest is the resolved base's content digest (an image manifest's
// "sha256:…", or a template build's own digest), never a tag, which moves.
// A step's Line and Force are not part of its key: neither changes what the
// step makes. Force is the runner's: a forced step and every step after it
// are rebuilt and their entries replaced under the same keys.
//
// A COPY without a FilesHash has no key (the runner fills it in once the
// files are uploaded), nor does an invalid step: both are errors.
func CacheKeys(baseDigest string, steps []Step) ([]string, error) {
	if baseDigest == "" {
		return nil, errdefs.New(errdefs.ErrInvalid, "the base has no digest to key the cache by")
	}
	h := sha256.New()
	writeField(h, keyVersion)
	writeField(h, baseDigest)
	prev := h.Sum(nil)

	keys := make([]string, len(steps))
	for i, s := range steps {
		if s.Kind == StepCopy && s.FilesHash == "" {
			return nil, errdefs.Newf(errdefs.ErrInvalid, "step %d (COPY %s): the files have no content hash yet", i+1, clip(s.Src))
		}
		h.Reset()
		h.Write(prev)
		writeStep(h, s)
		prev = h.Sum(nil)
		keys[i] = hex.EncodeToString(prev)
	}
	return keys, nil
}

// writeStep writes the fields of s that change what it makes, each with its
// length first so that no two different steps write the same bytes.
func writeStep(h hash.Hash, s Step) {
	writeField(h, string(s.Kind))
	switch s.Kind {
	case StepRun:
		writeField(h, s.Command)
		writeField(h, s.User)
	case StepCopy:
		writeField(h, s.Src)
		writeField(h, s.Dest)
		writeField(h, s.FilesHash)
		writeField(h, s.User)
		writeField(h, strconv.FormatUint(uint64(s.Mode), 8))
	case StepEnv, StepArg:
		writeField(h, strconv.Itoa(len(s.Env)))
		for _, e := range s.Env {
			writeField(h, e.Name)
			writeField(h, e.Value)
		}
	case StepWorkdir:
		writeField(h, s.Path)
	case StepUser:
		writeField(h, s.User)
	}
}

func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
