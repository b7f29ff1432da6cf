package main

import (
	"fmt"
	"go/types"
	"io"
	"slices"
	"strings"
)

// API returns the exported API of pkg, sorted, one feature a line:
//
//	const DefaultIdleTimeout time.Duration
//	func NewExecutor(ExecutorConfig) (*Executor, error)
//	method (*Executor) Submit(context.Context, func()) error
//	type ExecutorConfig struct, MaxWorkers int
//	type Handler interface, Handle(context.Context, *Delivery) error
//
// Types from pkg are written unqualified, others with their package path.
func API(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	str := func(t types.Type) string { return types.TypeString(t, qual) }
	sig := func(s *types.Signature) string {
		// Parameter names are not part of the API: renaming one is no
		// change for a caller.
		bare := types.NewSignatureType(nil, nil, nil, unnamed(s.Params()), unnamed(s.Results()), s.Variadic())
		return strings.TrimPrefix(types.TypeString(bare, qual), "func")
	}
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			add("const %s %s", name, str(obj.Type()))
		case *types.Var:
			add("var %s %s", name, str(obj.Type()))
		case *types.Func:
			s := obj.Type().(*types.Signature)
			add("func %s%s%s", name, typeParams(s.TypeParams(), str), sig(s))
		case *types.TypeName:
			typeAPI(add, obj, str, sig)
		}
	}
	slices.Sort(lines)
	return slices.Compact(lines)
}

// typeAPI adds the features of a declared type: its kind, its exported
// fields or interface methods, and the methods of its method set.
func typeAPI(add func(string, ...any), obj *types.TypeName, str func(types.Type) string, sig func(*types.Signature) string) {
	name := obj.Name()
	if obj.IsAlias() {
		add("type %s = %s", name, str(types.Unalias(obj.Type())))
		return
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		add("type %s %s", name, str(obj.Type()))
		return
	}
	decl := name + typeParams(named.TypeParams(), str)
	switch u := named.Underlying().(type) {
	case *types.Struct:
		add("type %s struct", decl)
		for f := range u.Fields() {
			if f.Exported() {
				if f.Embedded() {
					add("type %s struct, embedded %s", decl, str(f.Type()))
				} else {
					add("type %s struct, %s %s", decl, f.Name(), str(f.Type()))
				}
			}
		}
	case *types.Interface:
		add("type %s interface", decl)
		for m := range u.Methods() {
			if m.Exported() {
				add("type %s interface, %s%s", decl, m.Name(), sig(m.Type().(*types.Signature)))
			} else {
				add("type %s interface, unexported methods", decl)
			}
		}
		return
	default:
		add("type %s %s", decl, str(u))
	}
	ms := types.NewMethodSet(types.NewPointer(named))
	for sel := range ms.Methods() {
		m := sel.Obj()
		if !m.Exported() {
			continue
		}
		recv := "*" + decl
		if _, ptr := m.Type().(*types.Signature).Recv().Type().(*types.Pointer); !ptr && len(sel.Index()) == 1 {
			recv = decl
		}
		add("method (%s) %s%s", recv, m.Name(), sig(m.Type().(*types.Signature)))
	}
}

// unnamed returns the types of t's variables, without their names.
func unnamed(t *types.Tuple) *types.Tuple {
	vars := make([]*types.Var, t.Len())
	for i := range t.Len() {
		vars[i] = types.NewParam(t.At(i).Pos(), t.At(i).Pkg(), "", t.At(i).Type())
	}
	return types.NewTuple(vars...)
}

// typeParams formats a list of type parameters with their constraints:
// "[T any]"; "" when there are none.
func typeParams(tps *types.TypeParamList, str func(types.Type) string) string {
	if tps.Len() == 0 {
		return ""
	}
	parts := make([]string, tps.Len())
	for i := range tps.Len() {
		tp := tps.At(i)
		parts[i] = tp.Obj().Name() + " " + str(tp.Constraint())
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// diff is how an API differs from its snapshot.
type diff struct {
	// incompatible lists the features of the snapshot that are gone, and
	// the methods added to an interface of the snapshot.
	incompatible []string
	// added lists the other new features.
	added []string
}

func (d diff) empty() bool { return len(d.incompatible) == 0 && len(d.added) == 0 }

func (d diff) print(w io.Writer) {
	for _, f := range d.incompatible {
		fmt.Fprintf(w, "\tincompatible: %s\n", f)
	}
	for _, f := range d.added {
		fmt.Fprintf(w, "\tadded:        %s\n", f)
	}
}

// compare returns the changes from the features old to the features cur,
// both sorted.
func compare(old, cur []string) diff {
	var d diff
	for _, f := range old {
		if _, found := slices.BinarySearch(cur, f); !found {
			d.incompatible = append(d.incompatible, "removed "+f)
		}
	}
	for _, f := range cur {
		if _, found := slices.BinarySearch(old, f); found {
			continue
		}
		// A method added to an interface that existed breaks its
		// implementations.
		if head, _, ok := strings.Cut(f, ", "); ok && strings.HasSuffix(head, " interface") {
			if _, existed := slices.BinarySearch(old, head); existed {
				d.incompatible = append(d.incompatible, "added "+f)
				continue
			}
		}
		d.added = append(d.added, f)
	}
	return d
}
