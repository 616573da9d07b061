package process

import (
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/machinist-dev/machinist/providers"
)

// An agent's --capacity is one argument, which the agent splits at ','
// and '=': a resource name holding either would give the Node other
// resources than the class says. Check and Command refuse what
// CapacityFlag cannot write, before anything is made; what it writes is
// sorted, each quantity canonical.
func TestAgentsAreGivenOnlyResourceNamesAndQuantities(t *testing.T) {
	h := agents{}
	for what, name := range map[string]corev1.ResourceName{
		"a comma":  "cpu=64,memory",
		"a space":  "example.com/gpu --node-name=other",
		"no name":  "",
		"a prefix": "EXAMPLE.com/gpu",
	} {
		c := corev1.ResourceList{name: resource.MustParse("1")}
		if err := h.Check(nil, c, ""); err == nil {
			t.Errorf("%s: Check accepted %v", what, c)
		}
		dir := t.TempDir()
		if _, err := h.Command(Boot{Dir: dir, Capacity: c}); err == nil || !providers.IsPermanent(err) {
			t.Errorf("%s: Command gave %v, want a permanent error", what, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%s: Command made %v before it refused", what, entries)
		}
	}
	if err := h.Check(nil, corev1.ResourceList{"cpu": resource.MustParse("-1")}, ""); err == nil {
		t.Error("Check accepted a negative cpu")
	}

	c := corev1.ResourceList{"memory": resource.MustParse("0.5Gi"), "cpu": resource.MustParse("1.5"), "nvidia.com/gpu": resource.MustParse("1e0")}
	if err := h.Check(nil, c, ""); err != nil {
		t.Fatal(err)
	}
	want := "--capacity=cpu=1500m,memory=512Mi,nvidia.com/gpu=1"
	if args := h.args(Boot{Capacity: c}); !slices.Contains(args, want) {
		t.Errorf("the agent is given %q, want %s among them", args, want)
	}
}
