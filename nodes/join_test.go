package nodes

import (
	"regexp"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// A Machine's token IDs are kubeadm's shape, the same at every look (a
// reconcile that lost its reply finds its token again), and differ from
// one attempt to the next and between Machines.
func TestTokenIDs(t *testing.T) {
	shape := regexp.MustCompile(`^[a-z0-9]{6}$`)
	seen := map[string]bool{}
	for _, uid := range []types.UID{"3f1c2a4e-0000-4000-8000-000000000001", "3f1c2a4e-0000-4000-8000-000000000002", ""} {
		for i := range tokenIDs {
			id := tokenID(uid, i)
			if !shape.MatchString(id) {
				t.Errorf("token ID %q of %q/%d is not six of [a-z0-9]", id, uid, i)
			}
			if id != tokenID(uid, i) {
				t.Errorf("token ID of %q/%d changes between looks", uid, i)
			}
			if seen[id] {
				t.Errorf("token ID %q given twice", id)
			}
			seen[id] = true
		}
	}
}
