package image

import (
	"os"
	"path/filepath"
	"testing"
)

func TestHasCommand(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "usr/bin", "usr/local/lib/node_modules/x"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "usr/bin/git"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/bin/notes"), []byte("text\n"), 0o644))
	// npm's global install: a relative symlink that only resolves inside
	// the image.
	must(os.Symlink("../lib/node_modules/x/bin.js", filepath.Join(root, "usr/local/bin/opencode")))
	for name, want := range map[string]bool{"git": true, "opencode": true, "notes": false, "claude": false} {
		if got := HasCommand(root, name); got != want {
			t.Errorf("HasCommand(%q) = %v, want %v", name, got, want)
		}
	}
	if TemplateWith("claude") != "full" || TemplateWith("ls") != "" {
		t.Error("TemplateWith")
	}
}
