package machineset

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/patch"
	"github.com/machinist-dev/machinist/nodes/template"
)

// publishes reports whether ms is a node group of its own to the
// cluster-autoscaler: a set a MachineDeployment owns is scaled through
// its deployment, which publishes for it.
func publishes(ms *machinistv1.MachineSet) bool {
	ref := metav1.GetControllerOf(ms)
	return ref == nil || ref.Kind != "MachineDeployment"
}

// publish keeps on a set no deployment owns what a Node of its template
// will be, for the cluster-autoscaler to scale it up from zero
// (template.Publication).
func (r *Reconciler) publish(ctx context.Context, ms *machinistv1.MachineSet) error {
	if !publishes(ms) {
		return nil
	}
	p, err := template.Publication(ctx, r.Client, ms, &ms.Spec.Template)
	if err != nil || p.Empty() {
		return err
	}
	if err := r.Client.Patch(ctx, ms, p.Patch()); err != nil {
		return fmt.Errorf("publishing its Nodes' capacity: %w", patch.Conflict(err))
	}
	r.writes.Wrote(ms)
	return nil
}

// setsOfClass are the sets of the class's namespace that publish and
// whose template names it.
func (r *Reconciler) setsOfClass(ctx context.Context, o client.Object) []reconcile.Request {
	var list machinistv1.MachineSetList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if ms := &list.Items[i]; publishes(ms) && ms.Spec.Template.Spec.ClassRef.Name == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ms)})
		}
	}
	return reqs
}
