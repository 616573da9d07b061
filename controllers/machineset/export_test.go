package machineset

import (
	"context"

	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// What the external tests reach inside a Reconciler: its creation of a
// batch of names, and its expectations.

func (r *Reconciler) CreateMachines(ctx context.Context, ms *machinistv1.MachineSet, names []string) (int, error) {
	r.init()
	r.expectations.expectCreates(types.NamespacedName{Namespace: ms.Namespace, Name: ms.Name}, names)
	return r.createMachines(ctx, ms, names)
}

func (r *Reconciler) CreateUnsure(key types.NamespacedName, name string) {
	r.init()
	r.expectations.createUnsure(key, name)
}

func (r *Reconciler) UnsureCreates(key types.NamespacedName) []string {
	r.init()
	return r.expectations.unsureCreates(key)
}
