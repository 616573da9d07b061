// Package managementcluster keeps the ManagementCluster: the object that
// stands for the cluster the manager runs against, as a WorkloadCluster
// stands for another. It makes the one ManagementCluster (again, if it is
// deleted) and writes its Joinable condition from the checks package
// clusters/joinprobe makes in that cluster with the manager's own
// credentials: once at start, each period, and after a failed join of a
// Machine with no spec.clusterName.
package managementcluster

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
)

// key is the one ManagementCluster's.
var key = types.NamespacedName{Name: machinistv1.ManagementClusterName}

// Reconciler reconciles the ManagementCluster.
type Reconciler struct {
	// Client reads the ManagementCluster and Machines from the manager's
	// cache, and writes the ManagementCluster.
	Client client.Client
	// Config is how the checks reach the cluster: the manager's own
	// connection to it.
	Config *rest.Config
	// JoinableProbePeriod is how often the checks run again; zero means
	// joinprobe.DefaultPeriod.
	JoinableProbePeriod time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	joins joinprobe.Probes
}

// SetupWithManager registers the controller and its checks with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	r.joins.Object = func(types.NamespacedName) client.Object {
		return &machinistv1.ManagementCluster{ObjectMeta: metav1.ObjectMeta{Name: key.Name}}
	}
	if err := mgr.Add(&r.joins); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		// Its only writer is this controller, whose status writes must
		// not wake it: what wakes it is the object's coming and going.
		For(&machinistv1.ManagementCluster{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		Watches(&machinistv1.Machine{}, r.machineEvents()).
		WatchesRawSource(r.joins.Source()).
		// At start, the object may not be there to wake anything.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(reconcile.Request{NamespacedName: key})
			return nil
		})).
		WithOptions(opts).
		Named("managementcluster").
		Complete(r)
}

// Reconcile makes the ManagementCluster if it is missing, and brings its
// Joinable condition up to the latest check, starting one when due.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.NamespacedName != key {
		// No other name is admitted (its CEL rule); nothing to do.
		return reconcile.Result{}, nil
	}
	mc := &machinistv1.ManagementCluster{}
	err := r.Client.Get(ctx, key, mc)
	if apierrors.IsNotFound(err) {
		mc = &machinistv1.ManagementCluster{ObjectMeta: metav1.ObjectMeta{Name: key.Name}}
		// Its creation wakes this controller again.
		if err := r.Client.Create(ctx, mc); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	outcome, wait := r.joins.Next(ctx, key, r.Config, r.now(), r.period())
	if outcome != nil {
		before := mc.DeepCopy()
		if joinprobe.Set(&mc.Status.Conditions, machinistv1.ManagementClusterJoinable, mc.Generation, outcome) {
			// Optimistic: a write that lost a race is made again from
			// what the cache then holds.
			if err := r.Client.Status().Patch(ctx, mc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	return reconcile.Result{RequeueAfter: wait}, nil
}

// machineEvents asks for the cluster to be checked again when a Machine
// of the manager's own cluster (no spec.clusterName) starts to report a
// failed join, unless that is what the ManagementCluster already says:
// a fleet of failing Machines costs one check a minute.
func (r *Reconciler) machineEvents() handler.Funcs {
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			m, ok := e.ObjectNew.(*machinistv1.Machine)
			if !ok || m.Spec.ClusterName != "" {
				return
			}
			reason, failed := joinprobe.FailedJoin(e.ObjectOld, e.ObjectNew)
			if !failed || r.says(ctx, reason) {
				return
			}
			r.joins.Recheck(key)
			q.Add(reconcile.Request{NamespacedName: key})
		},
	}
}

// says reports whether the ManagementCluster's Joinable condition, in the
// cache, is False with reason.
func (r *Reconciler) says(ctx context.Context, reason string) bool {
	mc := &machinistv1.ManagementCluster{}
	if err := r.Client.Get(ctx, key, mc); err != nil {
		return false
	}
	c := meta.FindStatusCondition(mc.Status.Conditions, machinistv1.ManagementClusterJoinable)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

func (r *Reconciler) period() time.Duration {
	if r.JoinableProbePeriod > 0 {
		return r.JoinableProbePeriod
	}
	return joinprobe.DefaultPeriod
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
