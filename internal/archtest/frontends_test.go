package archtest

import (
	"fmt"
	"go/parser"
	"sort"
	"strings"
	"testing"
)

// frontEnds are the front ends: the packages that translate one wire
// format (REST, E2B's API and envd, MCP, the web console) into domain calls.
// They are peers over internal/edge, and none imports another: what two of
// them share belongs below them (internal/edge, internal/contract, the
// domain), and the router that mounts them belongs to none of them
// (internal/router, serve). Each entry covers the packages below it too
// (internal/e2b/envd is E2B's). This list is the one place that says which
// packages are front ends; a new front end is added here.
var frontEnds = []string{
	"internal/api",
	"internal/e2b",
	"internal/mcpserver",
	"internal/console",
}

// frontEndOf is the front end package rel belongs to, or "".
func frontEndOf(rel string) string {
	for _, fe := range frontEnds {
		if rel == fe || strings.HasPrefix(rel, fe+"/") {
			return fe
		}
	}
	return ""
}

// frontEndImport is one import of a front end's package by another's.
type frontEndImport struct {
	From, To string   // the importing and the imported package
	Files    []string // the files of From that import To
}

func (i frontEndImport) String() string {
	return fmt.Sprintf("%s imports %s in %s", i.From, i.To, strings.Join(i.Files, ", "))
}

// frontEndImports are the imports from one front end into another, in
// every file of the importing package, tests included (a test that needs
// another front end couples the two the same way).
func frontEndImports(t testing.TB, root string) []frontEndImport {
	t.Helper()
	var out []frontEndImport
	for _, fe := range frontEnds {
		for _, p := range packagesUnder(t, root, fe, parser.ImportsOnly) {
			for to, files := range p.Imports() {
				if other := frontEndOf(to); other != "" && other != fe {
					out = append(out, frontEndImport{From: p.Rel, To: to, Files: files})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// TestFrontEndsDoNotImportEachOther fails when a front end's package
// imports another front end's.
func TestFrontEndsDoNotImportEachOther(t *testing.T) {
	root := moduleRoot(t)
	found := frontEndImports(t, root)
	if len(found) == 0 {
		return
	}
	var lines []string
	for _, i := range found {
		lines = append(lines, "\t"+i.String())
	}
	msg := fmt.Sprintf("front ends are peers over internal/edge and import none of each other, but:\n%s\n"+
		"move what the importer uses below both front ends (access, forwarding and error statuses: internal/edge; "+
		"the REST contract's types and validation: internal/contract; mounting: internal/router or cmd/sandboxd), then drop the import",
		strings.Join(lines, "\n"))
	t.Error(msg)
}
