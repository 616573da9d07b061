package machinist_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// skipped are paths that hold no inputs or outputs of code generation.
var skipped = map[string]bool{".git": true, "bin": true, ".machinist": true, "hack/controlplane": true}

// TestGeneratedFilesAreCurrent regenerates deepcopy code, CRDs and RBAC in
// a copy of the tree and fails if any file differs from the committed one:
// API types changed without `make generate manifests` must not land.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	copyDir := t.TempDir()
	if err := copyTree(".", copyDir); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "--no-print-directory", "generate", "manifests")
	cmd.Dir = copyDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make generate manifests: %v\n%s", err, out)
	}
	err := filepath.WalkDir(copyDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(copyDir, path)
		if err != nil {
			return err
		}
		fresh, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		committed, err := os.ReadFile(rel)
		switch {
		case os.IsNotExist(err):
			t.Errorf("%s is generated but missing: run make generate manifests", rel)
		case err != nil:
			return err
		case !bytes.Equal(fresh, committed):
			t.Errorf("%s is stale: run make generate manifests", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skipped[filepath.ToSlash(path)] {
			if !d.IsDir() {
				// bin/ may be a link to a shared build; SkipDir on a file
				// would skip the rest of its directory.
				return nil
			}
			return filepath.SkipDir
		}
		target := filepath.Join(dst, path)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}
