package machine

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
)

// waiting begins the message of a pending operation a disruption budget
// holds back; what follows is the budget's refusal.
const waiting = "waiting: "

// holdForBudget asks the MachineDisruptionBudgets before a pending
// operation starts, whoever asked for it (the verbs, the annotation, a
// health check, a changed version): this is where every operation of a
// Running Machine passes, so none can slip by a budget. A refusal keeps
// the operation pending with the reason DisruptionHeld, says why in its
// message, with one Event per change of message, and looks again when the
// budget says it may allow it.
func (r *Reconciler) holdForBudget(ctx context.Context, s *step, op *machinistv1.Operation) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	store := disruption.Cached(r.APIReader, r.Client)
	req := disruption.Request{Machine: s.m, Reason: disruptionReason(op), OperationID: op.ID, By: op.RequestedBy,
		Override: op.Options != nil && op.Options.OverrideDisruptionBudgets}
	err := store.Admit(ctx, req, disruption.At(r.Calendar))
	refusal, refused := disruption.AsRefusal(err)
	if !refused {
		return false, err
	}
	op.Reason = machinistv1.ReasonDisruptionHeld
	if msg := waiting + refusal.Message; op.Message != msg {
		op.Message = msg
		verb := operation.Verb(op.Type)
		s.note(corev1.EventTypeWarning, machinistv1.ReasonDisruptionHeld, verb, "%s %s waits: %s", verb, op.ID, refusal.Message)
	}
	s.after(refusal.RetryAfter)
	return true, nil
}

// disruptionReason is the budget reason an operation counts under.
func disruptionReason(op *machinistv1.Operation) machinistv1.DisruptionReason {
	switch {
	case op.Source == machinistv1.SourceHealthCheck:
		return machinistv1.DisruptionRemediation
	case op.Type == machinistv1.OperationUpdate:
		return machinistv1.DisruptionUpdate
	case op.Type == machinistv1.OperationRepair:
		return machinistv1.DisruptionRepair
	}
	return machinistv1.DisruptionReboot
}

// heldMachines maps a budget that freed room to the Machines it selects
// whose pending operation a budget holds.
func (r *Reconciler) heldMachines(ctx context.Context, o client.Object) []reconcile.Request {
	b, ok := o.(*machinistv1.MachineDisruptionBudget)
	if !ok {
		return nil
	}
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(b.Namespace)); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		m := &list.Items[i]
		if !operation.Held(m.Status.Operation) {
			continue
		}
		if selected, err := disruption.Selects(b, m); err == nil && selected {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)})
		}
	}
	return reqs
}
