package machine

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/wake"
)

// machineByClass indexes Machines by the MachineClass they name.
const machineByClass = "spec.classRef.name"

// machineChanged passes the Machine updates that someone other than this
// controller makes: spec, labels, annotations, deletion, or a new operation
// recorded by the verbs server. The controller's own status writes are
// dropped, so that a write never wakes it again at once; what it waits for
// next it asks for with RequeueAfter, which is how a failing Machine costs
// one write per backoff step instead of one per watch event.
func machineChanged() predicate.Funcs {
	others := wake.OnChangeByOthers()
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*machinistv1.Machine), e.ObjectNew.(*machinistv1.Machine)
		return others.Update(e) || operationID(o) != operationID(n)
	}}
}

func operationID(m *machinistv1.Machine) string {
	if m.Status.Operation == nil {
		return ""
	}
	return m.Status.Operation.ID
}

// classChanged passes a MachineClass that appeared or whose spec changed
// (a new generation): a Machine waiting for its class, or failing on the
// provider the class named, must try again at once rather than after its
// backoff. A deleted class gives its Machines nothing new to do.
func classChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// machinesForClass maps a MachineClass to the Machines that name it.
func (r *Reconciler) machinesForClass(ctx context.Context, o client.Object) []reconcile.Request {
	return r.machinesMatching(ctx, "MachineClass "+o.GetNamespace()+"/"+o.GetName(),
		client.InNamespace(o.GetNamespace()), client.MatchingFields{machineByClass: o.GetName()})
}
