// Package wake decides which watch events wake a controller. A
// controller's own status write is itself a watch event; if it woke the
// controller, every write would cost a reconcile at once and a failing
// object would be retried as fast as the API server answers, whatever
// backoff the controller asked for.
package wake

import (
	"maps"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// OnChangeByOthers passes creates, deletes and the updates that people and
// other controllers make: the spec (seen as a new generation), labels,
// annotations and deletion. Updates of status alone, which only the
// object's own controller writes, are dropped; that controller asks to
// look again with RequeueAfter when it means to.
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
		!maps.Equal(o.GetAnnotations(), n.GetAnnotations())
}
