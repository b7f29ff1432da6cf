package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMutantsPlant: each planted bug's text is in the code as it is now
// (once), so that `make chaos-mutants` can plant it; and a text that is
// not there fails the planting.
func TestMutantsPlant(t *testing.T) {
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range Mutants {
		if names[m.Name] || m.Name == "" || m.Caught == nil || len(m.Edits) == 0 {
			t.Errorf("mutant %q: a name used once, Caught and edits are required", m.Name)
		}
		names[m.Name] = true
		dir := t.TempDir()
		for _, e := range m.Edits {
			b, err := os.ReadFile(filepath.Join(repo, e.File))
			if err != nil {
				t.Fatal(err)
			}
			to := filepath.Join(dir, e.File)
			if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(to, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := Plant(dir, m.Edits); err != nil {
			t.Errorf("mutant %s: %v", m.Name, err)
			continue
		}
		for _, e := range m.Edits {
			b, _ := os.ReadFile(filepath.Join(dir, e.File))
			if !strings.Contains(string(b), e.New) || e.New == e.Old {
				t.Errorf("mutant %s: %s does not hold the planted text", m.Name, e.File)
			}
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f.go"), []byte("package f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Plant(dir, []Edit{{File: "f.go", Old: "no such text", New: "x"}}); err == nil || !strings.Contains(err.Error(), "update the mutant") {
		t.Errorf("Plant of a text that is not there: %v, want an error that says to update the mutant", err)
	}
}
