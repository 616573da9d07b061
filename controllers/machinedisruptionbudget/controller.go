// Package machinedisruptionbudget is the MachineDisruptionBudget status
// controller: it keeps each budget's counts, window and ledger true. What
// a disruption may do is decided by package disruption, which the verbs
// server and every controller that disrupts a Machine ask.
package machinedisruptionbudget

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/wake"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/pause"
)

// Reconciler keeps each MachineDisruptionBudget's status true: the counts,
// the next window, and the record of admitted disruptions, from which it
// drops those that are over. It decides nothing; disruption.Admit does.
type Reconciler struct {
	Client client.Client
	// Now is the clock; time.Now when nil. Tests move it to open and
	// close windows.
	Now func() time.Time
	// StatusInterval is the shortest time between two status writes of one
	// budget whose spec did not change; zero means 1s, a negative value
	// writes every change at once. Its counts follow
	// every Machine it selects, and each write would contend with Admit's
	// records for the same object: a hundred reboots at once cost a
	// hundred writes of counts, each a conflict for an admission.
	StatusInterval time.Duration

	lastWrite sync.Map // budget key -> time of its last status write
}

// SetupWithManager registers the controller: a budget is looked at when
// it changes (not when only its status does: its own writes and Admit's
// are followed by a Machine's change anyway) and when a Machine of its
// namespace changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.MachineDisruptionBudget{}, builder.WithPredicates(wake.OnChangeByOthers())).
		Watches(&machinistv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.budgetsOf)).
		WithOptions(opts).
		Named("machinedisruptionbudget").
		Complete(r)
}

// budgetsOf maps a Machine to the budgets of its namespace that select
// it, or that hold a record of it (one that left a selector still ends
// there): each look at a budget lists the namespace's Machines, so a
// Machine wakes only the budgets it matters to.
func (r *Reconciler) budgetsOf(ctx context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*machinistv1.Machine)
	if !ok {
		return nil
	}
	var list machinistv1.MachineDisruptionBudgetList
	if err := r.Client.List(ctx, &list, client.InNamespace(m.Namespace)); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		b := &list.Items[i]
		selected, err := disruption.Selects(b, m)
		recorded := slices.ContainsFunc(b.Status.Disruptions, func(d machinistv1.Disruption) bool { return d.Machine == m.Name })
		if selected || recorded || err != nil {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(b)})
		}
	}
	return reqs
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile writes the budget's status when it changed, and asks to look
// again when it changes by itself.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	b := &machinistv1.MachineDisruptionBudget{}
	if err := r.Client.Get(ctx, req.NamespacedName, b); err != nil {
		if apierrors.IsNotFound(err) {
			r.lastWrite.Delete(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if p := pause.Of(b, "MachineDisruptionBudget"); p.Paused() {
		// Its counts stay as they were. Disruptions are still admitted
		// against it (admission reads the Machines and records its own
		// reservations), but none it recorded is pruned meanwhile: a
		// paused budget can only allow less, never more.
		if !pause.Mark(&b.Status.Conditions, p) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Status().Update(ctx, b))
	}
	var machines machinistv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(b.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	now := r.now()
	before := b.Status.DeepCopy()
	pause.Mark(&b.Status.Conditions, pause.Pause{})
	st, err := disruption.Evaluate(b, machines.Items, now)
	if err != nil {
		// A window kube-apiserver admitted but cron cannot read, or a
		// time zone this host does not know: say so; allow nothing.
		b.Status.ObservedGeneration = b.Generation
		b.Status.DisruptionsAllowed = 0
		meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionDisruptionAllowed, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonInvalidWindow,
			Message: err.Error(), ObservedGeneration: b.Generation,
		})
	} else {
		disruption.Fill(b, st, st.Disruptions, st.Disrupted, now)
	}
	if !equality.Semantic.DeepEqual(before, &b.Status) {
		if wait := r.untilNextWrite(req.NamespacedName); wait > 0 && before.ObservedGeneration == b.Generation {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		if err := r.Client.Status().Update(ctx, b); err != nil {
			if apierrors.IsConflict(err) {
				// Admit recorded a disruption meanwhile: look again.
				return ctrl.Result{Requeue: true}, nil
			}
			return ctrl.Result{}, err
		}
		r.lastWrite.Store(req.NamespacedName, time.Now())
	}
	if !st.Changes.IsZero() {
		return ctrl.Result{RequeueAfter: max(time.Second, st.Changes.Sub(now)+time.Second)}, nil
	}
	return ctrl.Result{}, nil
}

// untilNextWrite is how long the status of the budget key must wait for
// its next write, by the real clock: the calendar may jump.
func (r *Reconciler) untilNextWrite(key client.ObjectKey) time.Duration {
	v, ok := r.lastWrite.Load(key)
	if !ok || r.StatusInterval < 0 {
		return 0
	}
	interval := r.StatusInterval
	if interval <= 0 {
		interval = time.Second
	}
	return time.Until(v.(time.Time).Add(interval))
}
