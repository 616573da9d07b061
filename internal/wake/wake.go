// Package wake decides which watch events wake a controller. A
// controller's own status write is itself a watch event; if it woke the
// controller, every write would cost a reconcile at once and a failing
// object would be retried as fast as the API server answers, whatever
// backoff the controller asked for.
package wake

import (
	"maps"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// OnChangeByOthers passes creates, deletes and the updates that people and
// other controllers make: the spec (seen as a new generation), labels,
// annotations and deletion. Updates of status alone, which only the
// object's own controller writes, are dropped; that controller asks to
// look again with RequeueAfter when it means to. An update to an older
// version than the one seen (rewound) passes whatever it changed.
func OnChangeByOthers() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return changedByOthers(e.ObjectOld, e.ObjectNew)
	}}
}

func changedByOthers(o, n client.Object) bool {
	od, nd := o.GetDeletionTimestamp(), n.GetDeletionTimestamp()
	return o.GetGeneration() != n.GetGeneration() ||
		(od == nil) != (nd == nil) ||
		!maps.Equal(o.GetLabels(), n.GetLabels()) ||
		!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
		rewound(o, n)
}

// rewound reports whether n is an older version of the object than o, by
// its resourceVersion, which only grows within one etcd. Going back is
// history rewritten: the management cluster's etcd restored to an older
// snapshot under a running manager, whose informers list again and
// deliver the snapshot's version as an update of the newer one they had.
// Its status too is then not the controller's last write (a reboot the
// controller finished is in flight again), so it wakes the controller,
// which would otherwise never look at it again. A resourceVersion that is
// not a number tells nothing.
func rewound(o, n client.Object) bool {
	c, err := resourceversion.CompareResourceVersion(n.GetResourceVersion(), o.GetResourceVersion())
	return err == nil && c < 0
}

// OnReachabilityChange passes a WorkloadCluster whose Reachable condition
// changed (its status or reason): the Machines of a cluster that came back
// may go on, and those of a cluster that went away must wait. The
// cluster's other status writes (its Node count, a probe's time) are
// dropped.
func OnReachabilityChange() predicate.Funcs {
	return onClusterCondition(machinistv1.WorkloadClusterReachable)
}

// OnJoinableChange passes a WorkloadCluster, or the ManagementCluster,
// whose Joinable condition changed (its status or reason): the Machines waiting to join a cluster
// that could not be joined may go on, and new ones wait, saying why. A
// new message with the same reason is dropped.
func OnJoinableChange() predicate.Funcs {
	return onClusterCondition(machinistv1.WorkloadClusterJoinable)
}

// onClusterCondition passes a WorkloadCluster or ManagementCluster whose
// condition of type kind appeared, went or changed its status or reason.
func onClusterCondition(kind string) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok := clusterConditions(e.ObjectOld)
		n, ok2 := clusterConditions(e.ObjectNew)
		if !ok || !ok2 {
			return true
		}
		oc := meta.FindStatusCondition(o, kind)
		nc := meta.FindStatusCondition(n, kind)
		return (oc == nil) != (nc == nil) || (nc != nil && (oc.Status != nc.Status || oc.Reason != nc.Reason))
	}}
}

// clusterConditions are the conditions of a WorkloadCluster or the
// ManagementCluster.
func clusterConditions(o client.Object) ([]metav1.Condition, bool) {
	switch c := o.(type) {
	case *machinistv1.WorkloadCluster:
		return c.Status.Conditions, true
	case *machinistv1.ManagementCluster:
		return c.Status.Conditions, true
	}
	return nil, false
}
