package main

import (
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadFixture loads one of the fixture packages under testdata with the
// loader apicheck uses on the real packages.
func loadFixture(t *testing.T, name string) []*types.Package {
	t.Helper()
	pkgs, err := load([]string{"./testdata/" + name})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// writeChangelog writes a changelog whose Unreleased section is unreleased.
func writeChangelog(t *testing.T, dir, unreleased string) string {
	t.Helper()
	f := filepath.Join(dir, "CHANGELOG.md")
	text := "# Changelog\n\n## [Unreleased]\n\n" + unreleased + "\n## [0.1.0] - 2026-12-01\n\n- Close, Open, Put: named in a released version only.\n"
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestAPIListsFeatures(t *testing.T) {
	got := API(loadFixture(t, "old")[0])
	want := []string{
		"func Close()",
		"func Open(Options) (Store, error)",
		"type Options struct",
		"type Options struct, Size int",
		"type Store interface",
		"type Store interface, Get(string) (string, error)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("API =\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func TestCheckFailsOnIncompatibleChange(t *testing.T) {
	dir := t.TempDir()
	changelog := writeChangelog(t, dir, "")
	snap := filepath.Join(dir, "api")
	var out strings.Builder
	if err := runWrite(&out, snap, changelog, loadFixture(t, "old")); err != nil {
		t.Fatalf("writing the first snapshot: %v", err)
	}
	if err := runCheck(&out, snap, loadFixture(t, "old")); err != nil {
		t.Fatalf("check of the unchanged API: %v\n%s", err, out.String())
	}

	breaking := loadFixture(t, "breaking")
	out.Reset()
	if err := runCheck(&out, snap, breaking); err == nil {
		t.Fatal("check passed an incompatible change")
	}
	for _, want := range []string{
		"incompatible: removed func Close()",
		"incompatible: removed func Open(Options) (Store, error)",
		"incompatible: added type Store interface, Put(string, string) error",
		"added:        func Open(string, Options) (Store, error)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check's report lacks %q:\n%s", want, out.String())
		}
	}

	// The snapshot is not regenerated until the changelog names each
	// incompatible change.
	out.Reset()
	changelog = writeChangelog(t, dir, "- Removed `Close`; `Open` takes a name.\n")
	err := runWrite(&out, snap, changelog, breaking)
	if err == nil || !strings.Contains(err.Error(), `(name "Put")`) || strings.Contains(err.Error(), `(name "Close")`) {
		t.Fatalf("write with Put missing from the changelog = %v, want an error that names Put only", err)
	}
	if err := runCheck(&out, snap, breaking); err == nil {
		t.Fatal("a refused write changed the snapshot")
	}
	changelog = writeChangelog(t, dir, "- Removed `Close`; `Open` takes a name; `Store` has `Put`.\n")
	if err := runWrite(&out, snap, changelog, breaking); err != nil {
		t.Fatalf("write with every change in the changelog: %v", err)
	}
	out.Reset()
	if err := runCheck(&out, snap, breaking); err != nil {
		t.Fatalf("check after the snapshot was regenerated: %v\n%s", err, out.String())
	}
}

func TestCheckCompatibleChange(t *testing.T) {
	dir := t.TempDir()
	changelog := writeChangelog(t, dir, "")
	snap := filepath.Join(dir, "api")
	var out strings.Builder
	if err := runWrite(&out, snap, changelog, loadFixture(t, "old")); err != nil {
		t.Fatal(err)
	}
	compatible := loadFixture(t, "compatible")
	out.Reset()
	// Additions still fail the check, so that the snapshot stays current,
	// but none of them is incompatible, and a renamed parameter is no change.
	if err := runCheck(&out, snap, compatible); err == nil {
		t.Fatal("check passed a snapshot that lacks the additions")
	}
	if strings.Contains(out.String(), "incompatible") {
		t.Errorf("compatible changes reported as incompatible:\n%s", out.String())
	}
	for _, want := range []string{"added:        func Version() string", "added:        type Options struct, Name string"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check's report lacks %q:\n%s", want, out.String())
		}
	}
	// Regenerating needs no changelog entry.
	if err := runWrite(&out, snap, changelog, compatible); err != nil {
		t.Fatalf("write of compatible changes: %v", err)
	}
	if err := runCheck(&out, snap, compatible); err != nil {
		t.Fatalf("check after the snapshot was regenerated: %v", err)
	}
}

func TestFeatureName(t *testing.T) {
	for f, want := range map[string]string{
		"removed func Open(string, Options) (Store, error)":        "Open",
		"removed func Go[T any](context.Context, *Executor) error": "Go",
		"removed method (*Group[T any]) TryGo(func()) error":       "TryGo",
		"removed type Options struct, Size int":                    "Size",
		"removed type Options struct":                              "Options",
		"removed type Config struct, embedded *log/slog.Logger":    "Logger",
		"added type Store interface, Put(string, string) error":    "Put",
		"removed const DefaultIdleTimeout time.Duration":           "DefaultIdleTimeout",
	} {
		if got := featureName(f); got != want {
			t.Errorf("featureName(%q) = %q, want %q", f, got, want)
		}
	}
}
