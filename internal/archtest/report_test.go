package archtest

import (
	"fmt"
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

// TestReportStructure prints the structure figures of issue 32's closing
// note (scripts/structure-metrics.sh runs it): the longest hand-written
// functions, the imports between front ends, and sandbox.Manager's methods
// with how many of its entry points take a store.Sandbox row. It checks
// nothing, and runs only when ARCHTEST_REPORT is set (to how many of the
// longest functions to list; any other value lists 15).
func TestReportStructure(t *testing.T) {
	v := os.Getenv("ARCHTEST_REPORT")
	if v == "" {
		t.Skip("a report, not a check: set ARCHTEST_REPORT (e.g. ARCHTEST_REPORT=15) to print it")
	}
	top, err := strconv.Atoi(v)
	if err != nil || top <= 0 {
		top = 15
	}
	root := moduleRoot(t)
	pkgs := packagesUnder(t, root, ".", parser.SkipObjectResolution)

	var out strings.Builder
	fmt.Fprintf(&out, "== the %d longest functions (hand-written, tests and generated files left out)\n", top)
	for _, f := range longestFuncs(t, root, pkgs, top) {
		fmt.Fprintf(&out, "%5d  %s:%d %s\n", f.Lines, f.File, f.Line, f.Name)
	}

	fmt.Fprintf(&out, "\n== imports between front ends (%s; tests included)\n", strings.Join(frontEnds, ", "))
	imports := frontEndImports(t, root)
	for _, i := range imports {
		fmt.Fprintf(&out, "%s -> %s (%d files)\n", i.From, i.To, len(i.Files))
	}
	fmt.Fprintf(&out, "total: %d\n", len(imports))

	fmt.Fprintf(&out, "\n== sandbox.Manager (internal/sandbox)\n")
	out.WriteString(managerReport(pkgs))
	// Printed whole, not through t.Log, so that the script's output has no
	// test prefixes.
	fmt.Print(out.String())
}

// longestFuncs are the top longest function declarations of pkgs' hand-written
// non-test files.
func longestFuncs(t testing.TB, root string, pkgs []goPackage, top int) []funcLength {
	fset := token.NewFileSet()
	var all []funcLength
	for _, p := range pkgs {
		for _, f := range p.Files {
			if f.Test || ast.IsGenerated(f.File) {
				continue
			}
			// The files were parsed with another FileSet: parse again for
			// positions (cheap next to go vet).
			file, err := parser.ParseFile(fset, filepath.Join(root, filepath.FromSlash(f.Name)), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, funcLengths(fset, f.Name, file)...)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Lines > all[j].Lines })
	if len(all) > top {
		all = all[:top]
	}
	return all
}

// managerReport counts the methods of internal/sandbox's Manager, its
// exported ones, and the exported ones with a store.Sandbox parameter (a
// row the caller loaded, where an id and a principal belong).
func managerReport(pkgs []goPackage) string {
	var total, exported int
	var rows []string
	for _, p := range pkgs {
		if p.Rel != "internal/sandbox" {
			continue
		}
		for _, f := range p.Files {
			if f.Test {
				continue
			}
			storeName := importName(f.File, modulePath+"/internal/store")
			for _, d := range f.File.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv == nil || !strings.HasPrefix(funcName(fn), "Manager.") {
					continue
				}
				total++
				if !fn.Name.IsExported() {
					continue
				}
				exported++
				if storeName != "" && takesRow(fn, storeName) {
					rows = append(rows, fn.Name.Name)
				}
			}
		}
	}
	if total == 0 {
		return "no Manager in internal/sandbox\n"
	}
	sort.Strings(rows)
	return fmt.Sprintf("methods: %d, exported: %d, exported taking a store.Sandbox row: %d\n%s\n",
		total, exported, len(rows), strings.Join(rows, " "))
}

// importName is the name file refers to the package path by, or "".
func importName(file *ast.File, path string) string {
	for _, is := range file.Imports {
		if p, _ := strconv.Unquote(is.Path.Value); p == path {
			if is.Name != nil {
				return is.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}

// takesRow says a parameter of fn is a store.Sandbox, a pointer to one, or
// a slice of them.
func takesRow(fn *ast.FuncDecl, storeName string) bool {
	for _, field := range fn.Type.Params.List {
		typ := field.Type
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.ArrayType:
			typ = x.Elt
		}
		if sel, ok := typ.(*ast.SelectorExpr); ok && sel.Sel.Name == "Sandbox" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == storeName {
				return true
			}
		}
	}
	return false
}
