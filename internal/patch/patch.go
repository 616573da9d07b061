// Package patch builds JSON patches (RFC 6902) whose test operations make
// a write conditional on exactly the fields it was computed from. A merge
// patch computed from a cached object carries no condition at all: sent
// from a stale cache, or stored late after a 504, it writes over what
// another writer set since. A resourceVersion lock conditions the write on
// the whole object, so it is refused for any change, however unrelated (a
// Node's kubelet heartbeat, a set's status). A test operation conditions
// it on the fields that matter: a MachineSet's generation for its size, a
// Node's taints for a change of taints.
package patch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// JSON is a JSON patch being built.
type JSON []op

type op struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value"`
}

// Test makes the patch apply only if the value at path equals v (null for
// a path that does not exist).
func (p *JSON) Test(path string, v any) { p.add("test", path, v) }

// Set puts v at path, replacing what is there.
func (p *JSON) Set(path string, v any) { p.add("add", path, v) }

// Remove takes away what is at path, which must be there.
func (p *JSON) Remove(path string) { *p = append(*p, op{Op: "remove", Path: path}) }

func (p *JSON) add(kind, path string, v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		// Only values of API types are set; they always marshal.
		panic(err)
	}
	*p = append(*p, op{Op: kind, Path: path, Value: raw})
}

// Empty reports whether the patch changes nothing.
func (p JSON) Empty() bool {
	for _, o := range p {
		if o.Op != "test" {
			return false
		}
	}
	return true
}

// Patch is the patch for a client.
func (p JSON) Patch() client.Patch {
	raw, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return client.RawPatch(types.JSONPatchType, raw)
}

// Key escapes a map key (a label or annotation name) for a path.
func Key(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}

// Conflict turns the refusal of a patch whose test failed into the
// Conflict it is: the object changed since it was read, and the write must
// be decided again from a fresh look. kube-apiserver answers any JSON
// patch it cannot apply with a bare 422 (reason Invalid, its generic
// message, no causes, the reason itself dropped), unlike a validation
// failure, which names its fields; the patches built here add only under
// paths they read, so their one way to fail so is a test. Any other error
// is returned as it is.
func Conflict(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) {
		return err
	}
	st := status.Status()
	if st.Message != unapplied || (st.Details != nil && len(st.Details.Causes) > 0) {
		return err
	}
	return apierrors.NewConflict(schema.GroupResource{}, "", fmt.Errorf("a tested value changed since it was read: %w", err))
}

// unapplied is kube-apiserver's message for a JSON patch it could not
// apply (apimachinery's NewGenericServerResponse for a 422).
const unapplied = "the server rejected our request due to an error in our request"
