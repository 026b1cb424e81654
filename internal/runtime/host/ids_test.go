package host

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestDir(t *testing.T) {
	state := t.TempDir()
	for _, d := range []string{"ids", "sandboxes/c1", "sandboxes/c2"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d := Dir(state)
	for id, cid := range map[string]string{"a": "c1", "b": "gone"} {
		if err := os.Symlink(filepath.Join("..", "sandboxes", cid), d.Path(id)); err != nil {
			t.Fatal(err)
		}
	}
	if cid, err := d.CID("a"); err != nil || cid != "c1" {
		t.Fatalf("CID(a) = %q, %v", cid, err)
	}
	if _, err := d.CID("nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("CID(nope) err = %v", err)
	}
	if ids, err := d.List(); err != nil || !reflect.DeepEqual(ids, []string{"a", "b"}) {
		t.Fatalf("List = %v, %v", ids, err)
	}
	// c2 is unclaimed; b's link dangles and is removed.
	if got := d.Claims(); !reflect.DeepEqual(got, map[string]string{"c1": "a"}) {
		t.Fatalf("Claims = %v", got)
	}
	if _, err := os.Lstat(d.Path("b")); !os.IsNotExist(err) {
		t.Fatalf("dangling link kept: %v", err)
	}
}
