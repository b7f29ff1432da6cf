package disker_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the most lines a function of the package may have, from
// its func keyword to its closing brace.
const maxFuncLines = 80

// TestNoLongFunctions fails when a function of the package (its non-test
// files) is over maxFuncLines lines: a longer one keeps its states in
// local variables where a reader cannot see them; split it by what its
// parts decide, as Request is (a value whose phases are methods).
func TestNoLongFunctions(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	funcs := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var what string
			switch fn := n.(type) {
			case *ast.FuncDecl:
				if fn.Body == nil {
					return false
				}
				what = funcName(fn)
			case *ast.FuncLit:
				what = "a function literal"
			default:
				return true
			}
			funcs++
			start, end := fset.Position(n.Pos()), fset.Position(n.End())
			if lines := end.Line - start.Line + 1; lines > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long, over %d", name, start.Line, what, lines, maxFuncLines)
			}
			return true
		})
	}
	if funcs < 100 {
		t.Fatalf("found %d functions in %d files: not the package's directory?", funcs, len(files))
	}
}

// funcName is fn's name, with its receiver's type for a method:
// "(*Disker).Request".
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		return fmt.Sprintf("(*%s).%s", typeName(star.X), fn.Name.Name)
	}
	return fmt.Sprintf("%s.%s", typeName(typ), fn.Name.Name)
}

// typeName is the name of a receiver's type, without its type parameters.
func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	}
	return fmt.Sprintf("%T", e)
}
