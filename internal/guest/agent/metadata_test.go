package agent

import (
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestUploadMetadata: X-Metadata-* headers are the metadata, keys lower-
// cased; what envd refuses is refused: bytes that are not printable
// US-ASCII, a key too long, a set over 4 KiB.
func TestUploadMetadata(t *testing.T) {
	h := http.Header{}
	h.Set("X-Metadata-Author", "mish")
	h.Set("x-metadata-stage", "draft")
	h.Set("X-Other", "no")
	md, err := uploadMetadata(h)
	if err != nil || !reflect.DeepEqual(md, map[string]string{"author": "mish", "stage": "draft"}) {
		t.Fatalf("%v %v", md, err)
	}
	if md, err := uploadMetadata(http.Header{"Content-Type": {"x"}}); md != nil || err != nil {
		t.Fatalf("none: %v %v", md, err)
	}
	for name, h := range map[string]http.Header{
		"a control byte": {"X-Metadata-A": {"x\x01"}},
		"a long key":     {"X-Metadata-" + strings.Repeat("k", 250): {"v"}},
		"over 4 KiB":     {"X-Metadata-A": {strings.Repeat("v", 2100)}, "X-Metadata-B": {strings.Repeat("v", 2100)}},
	} {
		if _, err := uploadMetadata(h); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
}

// TestMetadataRoundTrip: written to an open file, read back by path; a
// write replaces the set; other attributes stay. Skipped where the test's
// file system keeps no user attributes.
func TestMetadataRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := writeMetadata(f, map[string]string{"a": "1", "b": "2"}); err != nil {
		if xattrUnsupported(err) {
			t.Skip("no user extended attributes here")
		}
		t.Fatal(err)
	}
	if got := readMetadata(path); !reflect.DeepEqual(got, map[string]string{"a": "1", "b": "2"}) {
		t.Fatalf("read %v", got)
	}
	if err := writeMetadata(f, map[string]string{"b": "3"}); err != nil {
		t.Fatal(err)
	}
	if got := readMetadata(path); !reflect.DeepEqual(got, map[string]string{"b": "3"}) {
		t.Fatalf("after the replace %v", got)
	}
	if err := writeMetadata(f, nil); err != nil {
		t.Fatal(err)
	}
	if got := readMetadata(path); got != nil {
		t.Fatalf("after a clear %v", got)
	}
}
