package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

// ApplyVerified is Apply of the layer blob r into dir that also returns the
// blob's content address ("sha256:<hex>"), hashing the whole blob, also what
// the decoder did not need to read. When want is a content address
// ("sha256:..."), a blob that is not that one is an error: a layer fetched
// by id must be the layer of that id. Any other want (a name the caller
// gave) is not checked.
func ApplyVerified(ctx context.Context, r io.Reader, want, dir string, b *Budget) (string, error) {
	h := sha256.New()
	tee := io.TeeReader(r, h)
	if _, err := Apply(ctx, tee, dir, b); err != nil {
		return "", err
	}
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return "", fmt.Errorf("read the rest of the layer: %w", err)
	}
	id := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if strings.HasPrefix(want, "sha256:") && want != id {
		return "", fmt.Errorf("layer is %s, want %s", id, want)
	}
	return id, nil
}
