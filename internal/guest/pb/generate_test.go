package pb_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedIsCurrent regenerates the code from proto/ into a scratch
// directory with the pinned generator and compares it with what is
// committed, both ways: a .proto changed without `go generate`, a
// generated file edited by hand or left behind all fail. The first run
// builds buf from the module proxy (about a minute); -short skips it.
func TestGeneratedIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: not regenerating")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("go", "run", "github.com/bufbuild/buf/cmd/buf@v1.75.0", "generate", "proto", "--template", "proto/buf.gen.yaml", "-o", out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, b)
	}
	gen := func(dir string) map[string][]byte {
		files := map[string][]byte{}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || (filepath.Ext(p) != ".go") || filepath.Base(p) == "pb.go" || filepath.Base(p) == "generate_test.go" {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			files[rel] = b
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	want := gen(filepath.Join(out, "internal/guest/pb"))
	have := gen(filepath.Join(root, "internal/guest/pb"))
	if len(want) == 0 {
		t.Fatal("buf generated nothing")
	}
	for name, b := range want {
		if h, ok := have[name]; !ok {
			t.Errorf("%s is not committed: run go generate ./internal/guest/pb", name)
		} else if !bytes.Equal(h, b) {
			t.Errorf("%s is stale: run go generate ./internal/guest/pb", name)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is not generated from proto/ any more: remove it", name)
		}
	}
}
