package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxServeFuncLines is the longest a function of serve's composition root
// may be, from its "func" to its closing brace: long enough for one
// component's setup, short enough that serve reads as a list of them.
const maxServeFuncLines = 80

// serveFiles are the composition root's files: cmd/sandboxd/serve.go and
// serve_*.go, tests left out (a test is not part of the root).
func serveFiles(t testing.TB, root string) []string {
	t.Helper()
	dir := filepath.Join(root, "cmd", "sandboxd")
	files := []string{filepath.Join(dir, "serve.go")}
	more, err := filepath.Glob(filepath.Join(dir, "serve_*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		if !strings.HasSuffix(f, "_test.go") {
			files = append(files, f)
		}
	}
	return files
}

// funcLength is one function declaration and its length in lines.
type funcLength struct {
	Name  string // Recv.Name or Name
	File  string // relative to the module root
	Line  int
	Lines int // from "func" to the closing brace, both included
}

func (f funcLength) String() string {
	return fmt.Sprintf("%s:%d %s (%d lines)", f.File, f.Line, f.Name, f.Lines)
}

// funcLengths are the function declarations of file (closures count as
// part of the function that holds them).
func funcLengths(fset *token.FileSet, rel string, file *ast.File) []funcLength {
	var out []funcLength
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
		out = append(out, funcLength{Name: funcName(fn), File: rel, Line: start.Line, Lines: end.Line - start.Line + 1})
	}
	return out
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// TestServeFunctionsAreShort fails when a function of serve's composition
// root is longer than maxServeFuncLines.
func TestServeFunctionsAreShort(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var long []string
	for _, path := range serveFiles(t, root) {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, fn := range funcLengths(fset, filepath.ToSlash(rel), f) {
			if fn.Lines > maxServeFuncLines {
				long = append(long, "\t"+fn.String())
			}
		}
	}
	if len(long) == 0 {
		return
	}
	msg := fmt.Sprintf("functions of the composition root longer than %d lines (from func to its closing brace):\n%s\n"+
		"split each into one setup function per component, with its flag group and its constructor (as nomad's agent has setupServer and setupClient), "+
		"and pass what one component needs of another as a constructor argument, not by late binding",
		maxServeFuncLines, strings.Join(long, "\n"))
	t.Error(msg)
}
