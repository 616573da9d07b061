package testenv

import (
	"context"
	"testing"
)

// Class is an inmemory MachineClass for NewNamespace to create: its name,
// and its spec as JSON ("" for the provider's defaults).
type Class struct {
	Name, Spec string
}

var (
	// Small is the class most tests' Machines are of.
	Small = Class{Name: "small"}
	// Sick is a class whose machines never turn Ready.
	Sick = Class{Name: "sick", Spec: `{"neverReady":true}`}
)

// NewNamespace creates a namespace for one test, named prefix-<random>,
// with the inmemory MachineClasses given, and fails t if it cannot. Like
// Namespace, it leaves the namespace in place: only an Env with the
// ControllerManager option could delete it, and the control plane goes
// with the package's tests anyway. Ginkgo specs pass GinkgoTB().
func (e *Env) NewNamespace(t testing.TB, prefix string, classes ...Class) string {
	t.Helper()
	ctx := context.Background()
	ns, err := e.Namespace(ctx, prefix)
	if err != nil {
		t.Fatalf("creating a namespace %s-: %v", prefix, err)
	}
	for _, c := range classes {
		if err := e.InmemoryClass(ctx, ns, c.Name, c.Spec); err != nil {
			t.Fatalf("creating MachineClass %s in %s: %v", c.Name, ns, err)
		}
	}
	return ns
}
