package machinist_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/machinist-dev/machinist/"

// layers orders the module's packages from the bottom up: a package may
// import its own layer and those below it, never one above. A prefix
// ending in "/" names a folder and everything under it; any other names
// one package. The order is the design: the state table knows nothing of
// providers, the providers nothing of Nodes, and no domain package knows a
// controller.
var layers = []struct {
	name     string
	packages []string
}{
	{"API types and manifests", []string{"api/", "config", "config/", "apiserver/openapi", "providers/plugin/v1"}},
	{"helpers", []string{"internal/"}},
	{"the state table", []string{"lifecycle/phases"}},
	{"the lifecycle's rules", []string{"lifecycle/operation", "lifecycle/disruption", "lifecycle/pause"}},
	{"the provider contract", []string{"providers"}},
	{"the providers and their protocol", []string{"providers/"}},
	{"the drain", []string{"nodes/drain"}},
	{"the Node seam", []string{"nodes"}},
	{"what a template's Nodes will be, published", []string{"nodes/template"}},
	{"workload cluster connections, and what joining one needs", []string{"clusters", "clusters/"}},
	{"controllers and the verbs server", []string{"controllers/", "apiserver"}},
	{"wiring and the development harness", []string{"manager", "manager/", "dev/"}},
	{"commands and build tools", []string{"cmd/", "hack/"}},
	{"tests", []string{"test/"}},
}

// layer is the index of pkg's layer in layers, and its name; -1 when no
// layer names it. A package is in the most specific layer that names it
// ("providers/plugin/v1" in the API's, not the providers').
func layer(pkg string) (int, string) {
	p := strings.TrimPrefix(pkg, module)
	best, bestLen := -1, -1
	for i, l := range layers {
		for _, prefix := range l.packages {
			match := p == prefix || (strings.HasSuffix(prefix, "/") && strings.HasPrefix(p, prefix))
			if match && len(prefix) > bestLen {
				best, bestLen = i, len(prefix)
			}
		}
	}
	if best < 0 {
		return -1, ""
	}
	return best, layers[best].name
}

// TestLayersOnlyPointDown fails on an import from a lower layer to a higher
// one (internal/ importing a domain package, the state table importing a
// provider, a controller importing the wiring), on one controller
// importing another or the verbs server importing a controller, and on a
// package no layer names, which must be given one.
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
			t.Errorf("%s is in no layer; add it to layers in layers_test.go", pkg)
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
			case what == "controllers and the verbs server" && il == l && tree(pkg) != tree(imp):
				t.Errorf("%s imports %s, on its own layer (%s); move what they share below them", pkg, imp, what)
			}
		}
	}
}

// TestTheVerbsServerAndThePluginLinkNoController fails when anything the
// verbs server or the kubectl plugin links, however indirectly, is a
// controller: both run where a controller's code, its watches and its
// permissions have no business (docs/architecture.md).
func TestTheVerbsServerAndThePluginLinkNoController(t *testing.T) {
	for _, pattern := range []string{"./apiserver/...", "./cmd/kubectl-machine/..."} {
		out, err := exec.Command("go", "list", "-deps", pattern).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pattern, err)
		}
		for dep := range strings.Lines(string(out)) {
			if strings.HasPrefix(strings.TrimSpace(dep), module+"controllers/") {
				t.Errorf("%s links %s", pattern, strings.TrimSpace(dep))
			}
		}
	}
}

// tree is the part of a package's path that says which controller, or
// the verbs server, it belongs to.
func tree(pkg string) string {
	parts := strings.Split(strings.TrimPrefix(pkg, module), "/")
	if parts[0] == "controllers" && len(parts) > 1 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}
