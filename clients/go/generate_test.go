package client

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedClientUpToDate: client.gen.go is what the pinned
// oapi-codegen makes of the committed document now (whose own freshness
// cmd/sandboxd's TestCommittedOpenAPI checks).
func TestGeneratedClientUpToDate(t *testing.T) {
	// The tool as go.mod pins it; -n prints where the go command built it.
	out, err := exec.Command("go", "tool", "-n", "oapi-codegen").Output()
	if err != nil {
		t.Fatalf("go tool -n oapi-codegen: %v", err)
	}
	tool := strings.TrimSpace(string(out))
	config, err := filepath.Abs("oapi-codegen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := filepath.Abs(filepath.Join("..", "..", "api", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The configuration names its output relative to where it runs.
	dir := t.TempDir()
	gen := exec.Command(tool, "-config", config, doc)
	gen.Dir = dir
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("oapi-codegen: %v\n%s", err, out)
	}
	fresh, err := os.ReadFile(filepath.Join(dir, "client.gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatal("client.gen.go is not what oapi-codegen makes of api/openapi.json: run `go generate ./clients/go` and commit the result")
	}
}
