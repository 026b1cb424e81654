package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// modulePath is the module's import path (go.mod).
const modulePath = "github.com/sandboxd/sandboxd"

// goPackage is one directory of Go files, read from source.
type goPackage struct {
	// Rel is the directory relative to the module root, slash-separated
	// (internal/edge): the name ARCHITECTURE.md's rows use.
	Rel string
	// Files are the package's .go files (tests included), parsed.
	Files []goFile
}

type goFile struct {
	Name string // relative to the module root
	File *ast.File
	Test bool // a _test.go file
}

// Generated says every non-test file of p was generated ("// Code
// generated ... DO NOT EDIT."): its source is not written here, and the row
// of the package that generates it covers it.
func (p goPackage) Generated() bool {
	n := 0
	for _, f := range p.Files {
		if f.Test {
			continue
		}
		if !ast.IsGenerated(f.File) {
			return false
		}
		n++
	}
	return n > 0
}

// Imports are the module-internal packages p imports (relative to the
// module root), each with the files that import it.
func (p goPackage) Imports() map[string][]string {
	out := map[string][]string{}
	for _, f := range p.Files {
		for _, is := range f.File.Imports {
			path, err := strconv.Unquote(is.Path.Value)
			if err != nil || !strings.HasPrefix(path, modulePath+"/") {
				continue
			}
			rel := strings.TrimPrefix(path, modulePath+"/")
			out[rel] = append(out[rel], f.Name)
		}
	}
	return out
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// packagesUnder reads every Go package under dir (relative to the module
// root), as the go command sees them: directories named testdata, or whose
// name begins with "." or "_", are not packages and are not entered.
// mode is go/parser's (parser.ImportsOnly is enough for imports and the
// generated mark).
func packagesUnder(t testing.TB, root, dir string, mode parser.Mode) []goPackage {
	t.Helper()
	byDir := map[string]*goPackage{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != filepath.Join(root, dir) && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, mode|parser.ParseComments)
		if err != nil {
			return err
		}
		pkgDir := filepath.ToSlash(filepath.Dir(rel))
		p := byDir[pkgDir]
		if p == nil {
			p = &goPackage{Rel: pkgDir}
			byDir[pkgDir] = p
		}
		p.Files = append(p.Files, goFile{Name: rel, File: f, Test: strings.HasSuffix(name, "_test.go")})
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	out := make([]goPackage, 0, len(byDir))
	for _, p := range byDir {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out
}
