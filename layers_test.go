package machinist_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/machinist-dev/machinist/"

// layer is how far up a package sits: a package may import its own layer
// and those below, never one above. Within the controllers' layer no
// controller imports another: what they share lives below them.
func layer(pkg string) (int, string) {
	p := strings.TrimPrefix(pkg, module)
	first := strings.Split(p, "/")[0]
	switch {
	case first == "api" || first == "config" || p == "apiserver/openapi" || p == "providers/plugin/v1":
		return 0, "API types and manifests"
	case first == "internal":
		return 1, "helpers"
	case slices.Contains([]string{"lifecycle", "nodes", "providers", "clusters"}, first):
		return 2, "domain"
	case first == "controllers" || slices.Contains([]string{"apiserver"}, first):
		return 3, "controllers and the verbs server"
	case first == "manager" || first == "dev":
		return 4, "wiring"
	case first == "cmd" || first == "hack":
		return 5, "commands and build tools"
	case first == "test":
		return 6, "tests"
	}
	return -1, ""
}

// TestLayersOnlyPointDown fails on an import from a lower layer to a higher
// one (internal/ importing a domain package, a controller importing the
// wiring), on one controller importing another, and on a package no layer
// names, which must be given one.
func TestLayersOnlyPointDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := fields[0]
		if pkg == strings.TrimSuffix(module, "/") {
			continue // this test's own package
		}
		l, what := layer(pkg)
		if l < 0 {
			t.Errorf("%s is in no layer; add it to layer() in layers_test.go", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			il, iwhat := layer(imp)
			switch {
			case il > l:
				t.Errorf("%s (%s) imports %s (%s), a layer above it", pkg, what, imp, iwhat)
			case l == 3 && il == 3 && !samePackageTree(pkg, imp):
				t.Errorf("controller %s imports controller %s; move what they share below them", pkg, imp)
			}
		}
	}
}

func samePackageTree(a, b string) bool {
	top := func(p string) string {
		parts := strings.Split(strings.TrimPrefix(p, module), "/")
		if parts[0] == "controllers" && len(parts) > 1 {
			return parts[0] + "/" + parts[1]
		}
		return parts[0]
	}
	return top(a) == top(b)
}
