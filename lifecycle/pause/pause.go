// Package pause says whether the controllers may act on an object, by
// machinistv1.PausedAnnotation, and keeps the Paused condition that shows
// it. A pause is read from the object and, for a Machine, from its
// WorkloadCluster, both in the API: it survives a restart of the manager
// and a move to another one, which is what it is for.
package pause

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Pause is why an object is paused; the zero Pause is not paused.
type Pause struct {
	// Reason is machinistv1.ReasonPaused or ReasonClusterPaused.
	Reason string
	// Message says where the annotation is and how to resume.
	Message string
}

// Paused reports whether p pauses its object.
func (p Pause) Paused() bool { return p.Reason != "" }

// Annotated reports whether obj itself carries the annotation: present,
// with any value but "false", so that a person who writes
// machinist.dev/paused=false to resume is not kept paused.
func Annotated(obj metav1.Object) bool {
	v, ok := obj.GetAnnotations()[machinistv1.PausedAnnotation]
	return ok && !strings.EqualFold(strings.TrimSpace(v), "false")
}

// Of is the pause of obj, of kind kind, by its own annotation.
func Of(obj metav1.Object, kind string) Pause {
	if !Annotated(obj) {
		return Pause{}
	}
	return Pause{Reason: machinistv1.ReasonPaused, Message: fmt.Sprintf(
		"the %s has the annotation %s: no controller acts on it until it is removed (kubectl annotate %s %s %s-)",
		kind, machinistv1.PausedAnnotation, strings.ToLower(kind), obj.GetName(), machinistv1.PausedAnnotation)}
}

// Machine is the pause of m: its own annotation, or that of its
// WorkloadCluster, read from r (the manager's cache). A cluster that is
// not there pauses nothing.
func Machine(ctx context.Context, r client.Reader, m *machinistv1.Machine) (Pause, error) {
	if p := Of(m, "Machine"); p.Paused() {
		return p, nil
	}
	if m.Spec.ClusterName == "" {
		return Pause{}, nil
	}
	wc := &machinistv1.WorkloadCluster{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}, wc); err != nil {
		return Pause{}, client.IgnoreNotFound(err)
	}
	if !Annotated(wc) {
		return Pause{}, nil
	}
	return Pause{Reason: machinistv1.ReasonClusterPaused, Message: fmt.Sprintf(
		"its WorkloadCluster %s has the annotation %s: no controller acts on its Machines until it is removed (kubectl annotate workloadcluster %s %s-)",
		wc.Name, machinistv1.PausedAnnotation, wc.Name, machinistv1.PausedAnnotation)}, nil
}

// Mark keeps the Paused condition in conds true to p and reports whether
// it changed: True while paused, False (ReasonNotPaused) once resumed,
// and absent on an object never paused, so that pausing and resuming
// costs one write each and a fleet that never pauses none. It carries no
// observedGeneration: a spec changed while paused is not acted on, and
// costs no write either.
func Mark(conds *[]metav1.Condition, p Pause) bool {
	was := meta.FindStatusCondition(*conds, machinistv1.ConditionPaused)
	if !p.Paused() {
		if was == nil || was.Status == metav1.ConditionFalse {
			return false
		}
		return meta.SetStatusCondition(conds, metav1.Condition{Type: machinistv1.ConditionPaused,
			Status: metav1.ConditionFalse, Reason: machinistv1.ReasonNotPaused,
			Message: "no controller is kept off it: " + machinistv1.PausedAnnotation + " was removed"})
	}
	return meta.SetStatusCondition(conds, metav1.Condition{Type: machinistv1.ConditionPaused,
		Status: metav1.ConditionTrue, Reason: p.Reason, Message: p.Message})
}

// Toggled passes the updates that turn the annotation on or off, and
// nothing else: what a watch of another kind's objects needs to wake the
// objects they pause (a WorkloadCluster's Machines), since a pause is set
// on metadata, which makes no new generation.
func Toggled() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(e event.DeleteEvent) bool { return Annotated(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return Annotated(e.ObjectOld) != Annotated(e.ObjectNew)
		},
	}
}
