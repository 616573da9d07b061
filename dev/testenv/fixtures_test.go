package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheVersionsAreThoseBuilt: the fixtures' versions are what the
// builds pin, so that a test expecting a Node of Version or
// PreviousVersion is not failed by a version bump of the builds alone.
func TestTheVersionsAreThoseBuilt(t *testing.T) {
	for dir, want := range map[string]string{
		"hack/controlplane":       Version,
		"hack/node/kubelet-v1.36": PreviousVersion,
	} {
		raw, err := os.ReadFile(filepath.Join(Root(), dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if line := "require k8s.io/kubernetes " + want; !strings.Contains(string(raw), "\n"+line+"\n") {
			t.Errorf("%s/go.mod does not say %q", dir, line)
		}
	}
}
