package archtest

import (
	"bufio"
	"go/parser"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// architectureDoc is the map these tests hold to the code.
const architectureDoc = "docs/ARCHITECTURE.md"

// The package table's format: a header row "| Package | Owns |", then one
// row per package (or per small group of packages that share a purpose),
// whose first cell names the package paths in backticks, relative to the
// module root:
//
//	| `internal/edge` | what every front end asks before it touches the domain ... |
//	| `internal/flock`, `internal/mountinfo` | ... |
//
// A path ending in "/" names a directory that is not a Go package
// (`proto/`). Other backticked text of the first cell must be such paths;
// backticks in the second cell are free.
var tableHeader = regexp.MustCompile(`^\|\s*Package\s*\|\s*Owns\s*\|\s*$`)

var backticked = regexp.MustCompile("`([^`]+)`")

// packageRow is one package named in the table, with its line in the doc.
type packageRow struct {
	Path string
	Line int
}

// packageTable reads the paths named in the first cells of the package
// table of docs/ARCHITECTURE.md.
func packageTable(t testing.TB, root string) []packageRow {
	t.Helper()
	f, err := os.Open(filepath.Join(root, architectureDoc))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []packageRow
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case !in && tableHeader.MatchString(line):
			in = true
		case in && !strings.HasPrefix(line, "|"):
			in = false
		case in && strings.HasPrefix(line, "|-") || in && strings.HasPrefix(line, "|:"):
			// the separator under the header
		case in:
			cells := strings.Split(line, "|")
			if len(cells) < 3 {
				t.Errorf("%s:%d: a package row needs two cells: | `path` | what it owns |", architectureDoc, n)
				continue
			}
			names := backticked.FindAllStringSubmatch(cells[1], -1)
			if len(names) == 0 {
				t.Errorf("%s:%d: the first cell names no package: write each path in backticks, e.g. | `internal/edge` | ... |", architectureDoc, n)
			}
			for _, m := range names {
				rows = append(rows, packageRow{Path: m[1], Line: n})
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no package table (a header row \"| Package | Owns |\")", architectureDoc)
	}
	return rows
}

// TestArchitectureHasRowForEveryPackage fails when a Go package under
// internal/ has no row in the package table. A package whose every
// non-test file is generated (internal/guest/pb/process, ...) is covered by
// the row of a package above it (internal/guest/pb, which generates it).
func TestArchitectureHasRowForEveryPackage(t *testing.T) {
	root := moduleRoot(t)
	named := map[string]bool{}
	for _, r := range packageTable(t, root) {
		named[r.Path] = true
	}
	for _, p := range packagesUnder(t, root, "internal", parser.ImportsOnly) {
		if named[p.Rel] {
			continue
		}
		if p.Generated() && ancestorNamed(p.Rel, named) {
			continue
		}
		if p.Generated() {
			t.Errorf("%s holds only generated code and no package above it has a row in %s: add a row for the package that generates it, naming `%s` in its first cell", p.Rel, architectureDoc, p.Rel)
			continue
		}
		t.Errorf("%s has no row in %s: add one to the package table, | `%s` | what it owns (its doc comment's first sentence) |, or name it in the first cell of the row of the packages it belongs with", p.Rel, architectureDoc, p.Rel)
	}
}

func ancestorNamed(rel string, named map[string]bool) bool {
	for dir := path.Dir(rel); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if named[dir] {
			return true
		}
	}
	return false
}

// planned are the packages issue 32 is creating on other branches, whose
// rows are written ahead: a row may name them while they do not exist yet.
// Remove each one here as its branch is merged (the test says when), and
// rename its row if the package got another name.
var planned = map[string]string{
	"internal/contract": "the REST contract's types and validation, out of internal/api",
	"internal/router":   "the root-owned router and shared HTTP middleware",
}

// TestArchitectureRowsNameExistingPackages fails when the package table
// names a package that does not exist (a row left behind by a move or a
// deletion), or names one twice.
func TestArchitectureRowsNameExistingPackages(t *testing.T) {
	root := moduleRoot(t)
	seen := map[string]int{}
	for _, r := range packageTable(t, root) {
		if first, ok := seen[r.Path]; ok {
			t.Errorf("%s:%d: `%s` is named again (first on line %d): keep it in one row", architectureDoc, r.Line, r.Path, first)
			continue
		}
		seen[r.Path] = r.Line
		dir := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(r.Path, "/")))
		if strings.HasSuffix(r.Path, "/") {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				t.Errorf("%s:%d: `%s` is not a directory of the module: remove it from the row, or write the directory's new path", architectureDoc, r.Line, r.Path)
			}
			continue
		}
		goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if why, ok := planned[r.Path]; ok {
			if len(goFiles) > 0 {
				t.Errorf("%s exists now: remove it from archtest's planned list (its row stays)", r.Path)
			} else {
				t.Logf("%s:%d: `%s` does not exist yet, planned: %s", architectureDoc, r.Line, r.Path, why)
			}
			continue
		}
		if len(goFiles) == 0 {
			t.Errorf("%s:%d: `%s` is not a Go package of the module (no .go files in %s): remove its row, or write the package's new path (a directory that is not a package ends in /, as `proto/`)", architectureDoc, r.Line, r.Path, r.Path)
		}
	}
}
