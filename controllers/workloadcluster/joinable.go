package workloadcluster

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
)

// joinable brings wc's Joinable condition up to the latest check's
// outcome, and starts a check when one is due: on the cluster's first
// connection (and each new one), each JoinableProbePeriod, and after a
// Machine's failed join, at most once a minute. A cluster not connected,
// or failing its probes, keeps the condition it has.
func (r *Reconciler) joinable(ctx context.Context, wc *machinistv1.WorkloadCluster, result reconcile.Result) reconcile.Result {
	key := client.ObjectKeyFromObject(wc)
	cfg := r.Registry.Config(key)
	reachable := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
	if cfg == nil || r.isFailing(key) || reachable == nil || reachable.Status != metav1.ConditionTrue {
		return result
	}
	outcome, wait := r.joins.Next(ctx, key, cfg, r.now(), r.joinablePeriod())
	if outcome != nil {
		joinprobe.Set(&wc.Status.Conditions, machinistv1.WorkloadClusterJoinable, wc.Generation, outcome)
	}
	if wait > 0 && (result.RequeueAfter <= 0 || wait < result.RequeueAfter) {
		result.RequeueAfter = wait
	}
	return result
}

// machineEvents wakes a Machine's cluster when the Machine arrives or
// goes (the first may need a connection, the last may be what a deleted
// cluster waits for), and when its Ready condition starts to report a
// failed join: the cluster is then checked again, at most once a minute.
// A Machine's other updates are none of this controller's business.
func (r *Reconciler) machineEvents() handler.Funcs {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range clusterOf(context.Background(), o) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			reason, failed := joinprobe.FailedJoin(e.ObjectOld, e.ObjectNew)
			if !failed {
				return
			}
			for _, req := range clusterOf(ctx, e.ObjectNew) {
				if r.joinableSays(ctx, req.NamespacedName, reason) {
					// The Machine repeats its cluster's own condition:
					// nothing new to check.
					continue
				}
				r.joins.Recheck(req.NamespacedName)
				q.Add(req)
			}
		},
	}
}

// joinableSays reports whether the cluster's Joinable condition, in the
// cache, is False with reason.
func (r *Reconciler) joinableSays(ctx context.Context, key types.NamespacedName, reason string) bool {
	wc := &machinistv1.WorkloadCluster{}
	if err := r.Client.Get(ctx, key, wc); err != nil {
		return false
	}
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

func (r *Reconciler) joinablePeriod() time.Duration {
	if r.JoinableProbePeriod > 0 {
		return r.JoinableProbePeriod
	}
	return joinprobe.DefaultPeriod
}
