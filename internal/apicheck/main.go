// Command apicheck keeps the exported API of Disker's public packages stable.
//
// It lists a package's exported API as sorted lines of text, one line per
// feature (a function and its signature, a struct field, a method, an
// interface method), in the manner of the Go project's api/go1.*.txt files,
// and compares that listing with a snapshot checked in under api/:
//
//	apicheck -dir api -check ./ ./pool   # make apicheck: fails on any difference
//	apicheck -dir api -write ./ ./pool   # make api: regenerates the snapshot
//
// A feature of the snapshot that the code no longer has (removed, or its
// signature changed), and a method added to an interface (it breaks the
// interface's implementations), are incompatible changes. -write regenerates
// the snapshot only if CHANGELOG.md's Unreleased section names each of them,
// so that an incompatible change cannot land without telling users.
// Compatible additions need only the regenerated snapshot.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("dir", "api", "directory of the snapshot, one file per package")
	check := flag.Bool("check", false, "compare the code with the snapshot; fail on any difference")
	write := flag.Bool("write", false, "regenerate the snapshot (incompatible changes must be in the changelog)")
	changelog := flag.String("changelog", "CHANGELOG.md", "the changelog whose Unreleased section -write reads")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: apicheck [-dir api] -check|-write PACKAGE...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *check == *write || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	pkgs, err := load(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *check {
		err = runCheck(os.Stdout, *dir, pkgs)
	} else {
		err = runWrite(os.Stdout, *dir, *changelog, pkgs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// snapshotFile is the file of pkg's snapshot in dir: api/pool.txt.
func snapshotFile(dir string, pkg *types.Package) string {
	return filepath.Join(dir, pkg.Name()+".txt")
}

// runCheck compares each package's API with its snapshot and fails when they
// differ.
func runCheck(w io.Writer, dir string, pkgs []*types.Package) error {
	failed := false
	for _, pkg := range pkgs {
		old, err := readSnapshot(snapshotFile(dir, pkg))
		if err != nil {
			return err
		}
		d := compare(old, API(pkg))
		if d.empty() {
			continue
		}
		failed = true
		fmt.Fprintf(w, "package %s differs from %s:\n", pkg.Path(), snapshotFile(dir, pkg))
		d.print(w)
	}
	if failed {
		return errors.New("apicheck: the exported API differs from the snapshot; if the change is meant, " +
			"name each incompatible change in CHANGELOG.md's Unreleased section and run make api")
	}
	return nil
}

// runWrite regenerates each package's snapshot, provided the changelog's
// Unreleased section names every incompatible change.
func runWrite(w io.Writer, dir, changelog string, pkgs []*types.Package) error {
	unreleased, err := readUnreleased(changelog)
	if err != nil {
		return err
	}
	var missing []string
	apis := make([][]string, len(pkgs))
	for i, pkg := range pkgs {
		old, err := readSnapshot(snapshotFile(dir, pkg))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		apis[i] = API(pkg)
		for _, f := range compare(old, apis[i]).incompatible {
			if name := featureName(f); !mentions(unreleased, name) {
				missing = append(missing, fmt.Sprintf("%s: %s (name %q)", pkg.Path(), f, name))
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("apicheck: %s's Unreleased section does not name these incompatible changes:\n\t%s",
			changelog, strings.Join(missing, "\n\t"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, pkg := range pkgs {
		f := snapshotFile(dir, pkg)
		if err := os.WriteFile(f, []byte(strings.Join(apis[i], "\n")+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s (%d features)\n", f, len(apis[i]))
	}
	return nil
}

// readSnapshot reads the sorted features of a snapshot file.
func readSnapshot(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("apicheck: %w (run make api to create it)", err)
	}
	var lines []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines, nil
}

// readUnreleased returns the text of the changelog's "## [Unreleased]"
// section, up to the next "## " heading.
func readUnreleased(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("apicheck: changelog: %w", err)
	}
	var sec strings.Builder
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			in = strings.Contains(strings.ToLower(l), "unreleased")
			continue
		}
		if in {
			sec.WriteString(l)
			sec.WriteByte('\n')
		}
	}
	return sec.String(), sc.Err()
}

// mentions reports whether text has name as a whole word.
func mentions(text, name string) bool {
	return regexp.MustCompile(`(^|[^\pL\pN_])` + regexp.QuoteMeta(name) + `($|[^\pL\pN_])`).MatchString(text)
}

// featureName is the identifier a changelog must name for a feature: the
// member's name for a field or a method, else the declared name.
func featureName(change string) string {
	f := strings.TrimPrefix(strings.TrimPrefix(change, "removed "), "added ")
	var rest string
	switch {
	case strings.HasPrefix(f, "type "):
		head, member, ok := strings.Cut(f, ", ")
		rest = strings.TrimPrefix(head, "type ")
		if ok {
			rest = member
			if emb, ok := strings.CutPrefix(member, "embedded "); ok {
				rest = emb[strings.LastIndexAny(emb, "*.")+1:]
			}
		}
	case strings.HasPrefix(f, "method ("):
		_, rest, _ = strings.Cut(f, ") ")
	default: // const, var, func
		_, rest, _ = strings.Cut(f, " ")
	}
	if end := strings.IndexAny(rest, " (["); end >= 0 {
		return rest[:end]
	}
	return rest
}

// load type-checks the packages named by patterns from the export data the
// go command writes for them.
func load(patterns []string) ([]*types.Package, error) {
	args := append([]string{"list", "-export", "-json=ImportPath,Export,Name,DepOnly", "-deps"}, patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("apicheck: go list: %v\n%s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("apicheck: go list: %w", err)
	}
	exports := map[string]string{}
	var roots []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath, Export string
			DepOnly            bool
		}
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("apicheck: go list output: %w", err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("apicheck: no export data for %s", path)
		}
		return os.Open(f)
	})
	pkgs := make([]*types.Package, 0, len(roots))
	for _, path := range roots {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, fmt.Errorf("apicheck: %s: %w", path, err)
		}
		pkgs = append(pkgs, pkg)
	}
	return pkgs, nil
}
