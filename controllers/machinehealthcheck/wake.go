package machinehealthcheck

import (
	"context"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/lifecycle/pause"
)

// machineChanged passes the Machine changes a verdict or a rung depends
// on: labels, deletion, phase, its Node, and an operation starting or
// ending. What the health check writes itself (status.remediation, its
// condition, the operation it requests) wakes nothing.
func machineChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*machinistv1.Machine), e.ObjectNew.(*machinistv1.Machine)
		return (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
			!maps.Equal(o.Labels, n.Labels) ||
			o.Status.Phase != n.Status.Phase ||
			o.Status.ProviderID != n.Status.ProviderID ||
			nodeName(o) != nodeName(n) ||
			pause.Annotated(o) != pause.Annotated(n) ||
			(operationState(o) != operationState(n) && !requestedByHealthCheck(n))
	}}
}

func nodeName(m *machinistv1.Machine) string {
	if m.Status.NodeRef == nil {
		return ""
	}
	return m.Status.NodeRef.Name
}

func operationState(m *machinistv1.Machine) string {
	if op := m.Status.Operation; op != nil {
		return op.ID + "/" + string(op.State)
	}
	return ""
}

// requestedByHealthCheck: the operation was just recorded by a health check.
func requestedByHealthCheck(m *machinistv1.Machine) bool {
	op := m.Status.Operation
	return op != nil && op.State == machinistv1.OperationPending && op.Source == machinistv1.SourceHealthCheck &&
		strings.HasPrefix(op.RequestedBy, RequestedBy(""))
}

// nodeChanged passes a Node whose conditions changed status, not the
// heartbeats that only move their times.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return o.Spec.ProviderID != n.Spec.ProviderID || !maps.Equal(statuses(o), statuses(n))
	}}
}

func statuses(n *corev1.Node) map[corev1.NodeConditionType]corev1.ConditionStatus {
	out := make(map[corev1.NodeConditionType]corev1.ConditionStatus, len(n.Status.Conditions))
	for _, c := range n.Status.Conditions {
		out[c.Type] = c.Status
	}
	return out
}

// checksForMachine maps a Machine to the health checks that select it.
func (r *Reconciler) checksForMachine(ctx context.Context, o client.Object) []reconcile.Request {
	var list machinistv1.MachineHealthCheckList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "mapping a Machine to its health checks", "machine", o.GetName())
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		hc := &list.Items[i]
		s, err := metav1.LabelSelectorAsSelector(hc.Spec.Selector.AsMeta())
		if err == nil && s.Matches(labels.Set(o.GetLabels())) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(hc)})
		}
	}
	return reqs
}

// checksForNode maps a Node to the health checks of its Machine.
func (r *Reconciler) checksForNode(ctx context.Context, o client.Object) []reconcile.Request {
	id := o.(*corev1.Node).Spec.ProviderID
	if id == "" {
		return nil
	}
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.MatchingFields{index.MachineByProviderID: id}); err != nil {
		log.FromContext(ctx).Error(err, "mapping a Node to its Machine", "node", o.GetName())
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		reqs = append(reqs, r.checksForMachine(ctx, &list.Items[i])...)
	}
	return reqs
}

// checksInNamespace maps a WorkloadCluster to every health check in its
// namespace, the only ones that can select its Machines; a namespace has
// few.
func (r *Reconciler) checksInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	var list machinistv1.MachineHealthCheckList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "mapping a WorkloadCluster to the health checks of its namespace", "workloadCluster", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}
