package disker_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestEveryExportedFuncHasExample: each exported function and method of
// disker and pool (options included) has a runnable example, named as go
// doc expects: ExampleF, ExampleT_M, with an optional _suffix.
func TestEveryExportedFuncHasExample(t *testing.T) {
	for _, dir := range []string{".", "pool"} {
		want, examples := exportedFuncs(t, dir)
		var missing []string
		for _, name := range want {
			if !hasExample(examples, name) {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s: no Example for %d exported functions and methods:\n\t%s", dir, len(missing), strings.Join(missing, "\n\t"))
		}
	}
}

// exportedFuncs returns the exported functions ("F") and methods of
// exported types ("T_M") declared in dir, and the names of its examples.
func exportedFuncs(t *testing.T, dir string) (funcs []string, examples map[string]bool) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	examples = make(map[string]bool)
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		test := strings.HasSuffix(e.Name(), "_test.go")
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() {
				continue
			}
			switch {
			case test:
				if strings.HasPrefix(fd.Name.Name, "Example") && fd.Recv == nil {
					examples[fd.Name.Name] = true
				}
			case fd.Recv == nil:
				funcs = append(funcs, fd.Name.Name)
			default:
				if recv := recvName(fd.Recv.List[0].Type); ast.IsExported(recv) {
					funcs = append(funcs, recv+"_"+fd.Name.Name)
				}
			}
		}
	}
	slices.Sort(funcs)
	return funcs, examples
}

// recvName is the name of a receiver's type, without pointer or type
// parameters.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// hasExample reports whether examples hold one for name: "Example"+name,
// or that followed by "_" and a suffix that starts with a lower-case
// letter.
func hasExample(examples map[string]bool, name string) bool {
	for ex := range examples {
		rest, ok := strings.CutPrefix(ex, "Example"+name)
		if ok && (rest == "" || len(rest) > 1 && rest[0] == '_' && unicode.IsLower(rune(rest[1]))) {
			return true
		}
	}
	return false
}
