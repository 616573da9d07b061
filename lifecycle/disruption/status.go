package disruption

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// setCondition sets DisruptionAllowed from the counts in b's status.
func setCondition(b *machinistv1.MachineDisruptionBudget, _ time.Time) {
	s := &b.Status
	c := metav1.Condition{Type: machinistv1.ConditionDisruptionAllowed, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonDisruptionAllowed,
		Message:            fmt.Sprintf("%d more of %d Machines may be disrupted", s.DisruptionsAllowed, s.SelectedMachines),
		ObservedGeneration: b.Generation}
	switch {
	case !s.WindowOpen:
		c.Status, c.Reason = metav1.ConditionFalse, machinistv1.ReasonWindowClosed
		c.Message = "no window is open"
		if s.NextWindow != nil {
			c.Message += "; the next opens at " + s.NextWindow.UTC().Format(time.RFC3339)
		}
	case s.DisruptionsAllowed == 0:
		c.Status, c.Reason = metav1.ConditionFalse, machinistv1.ReasonBudgetSpent
		c.Message = fmt.Sprintf("%d of %d Machines are disrupted and %d may be", s.Disrupted, s.SelectedMachines, s.MaxDisrupted)
	}
	meta.SetStatusCondition(&s.Conditions, c)
}

// Freed passes the updates of a budget that may let a held disruption go:
// its allowance grew, a window opened, or its spec changed. An actor a
// budget holds watches budgets through it, so that it goes ahead within
// the budget's status interval of the allowance coming back, not at its
// next look (spentRetry later).
func Freed() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*machinistv1.MachineDisruptionBudget)
			n, ok2 := e.ObjectNew.(*machinistv1.MachineDisruptionBudget)
			if !ok1 || !ok2 {
				return false
			}
			return n.Generation != o.Generation || n.Status.DisruptionsAllowed > o.Status.DisruptionsAllowed ||
				n.Status.WindowOpen && !o.Status.WindowOpen
		},
	}
}
