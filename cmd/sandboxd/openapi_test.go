package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCommittedOpenAPI: api/openapi.json, which the typed clients (clients/go
// and clients/typescript) are generated from, is what `sandboxd openapi`
// prints, and so what the server serves; a change of the API's types or
// routes fails here until `go generate ./clients/go` is run.
func TestCommittedOpenAPI(t *testing.T) {
	t.Setenv("SANDBOXD_OUTPUT", "")
	committed, err := os.ReadFile(filepath.Join("..", "..", "api", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"openapi"})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), committed) {
		t.Fatalf("api/openapi.json differs from what `sandboxd openapi` prints (%d and %d bytes): run `go generate ./clients/go` "+
			"(not a built bin/sandboxd, whose version differs) and commit the result", len(committed), out.Len())
	}
}
