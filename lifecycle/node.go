package lifecycle

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/patch"
)

// Index names for the cache.
const (
	nodeByProviderID    = index.NodeByProviderID
	machineByProviderID = index.MachineByProviderID
)

// Reasons of the NodeHealthy condition.
const (
	reasonNodeHealthy      = "NodeReady"
	reasonNodeNotFound     = "NodeNotFound"
	reasonNodeNotReady     = "NodeNotReady"
	reasonNodeLeaseExpired = "NodeLeaseExpired"
)

// health is what the controller concludes about a Node.
type health struct {
	healthy bool
	reason  string
	message string
	// recheck is when the conclusion may change without an event: the
	// Lease's expiry. Zero when only an event can change it.
	recheck time.Time
}

// nodeFor returns the Node whose spec.providerID is providerID, or nil.
func (r *Reconciler) nodeFor(ctx context.Context, providerID string) (*corev1.Node, error) {
	return index.NodeFor(ctx, r.Client, providerID)
}

// nodeHealth judges a Node as the node lifecycle controller would: Ready,
// and a kubelet Lease renewed within its duration. The Lease matters
// because a dead kubelet cannot report itself NotReady.
func (r *Reconciler) nodeHealth(ctx context.Context, node *corev1.Node, now time.Time) (health, error) {
	if node == nil {
		return health{reason: reasonNodeNotFound, message: "no Node has this Machine's providerID"}, nil
	}
	ready := nodeCondition(node, corev1.NodeReady)
	if ready != nil && ready.Status == corev1.ConditionUnknown {
		// Unknown is how Kubernetes' node lifecycle controller marks a
		// dead kubelet's Node; the Lease says why better than the
		// condition does.
		if h, err := r.leaseHealth(ctx, node, now); err != nil || !h.healthy {
			return h, err
		}
	}
	if ready == nil || ready.Status != corev1.ConditionTrue {
		msg := "the Node has not reported Ready"
		if ready != nil {
			msg = fmt.Sprintf("Node %s is Ready=%s: %s", node.Name, ready.Status, ready.Message)
		}
		return health{reason: reasonNodeNotReady, message: msg}, nil
	}
	return r.leaseHealth(ctx, node, now)
}

// leaseHealth judges a Node by its kubelet's Lease alone.
func (r *Reconciler) leaseHealth(ctx context.Context, node *corev1.Node, now time.Time) (health, error) {
	var lease coordinationv1.Lease
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node.Name}, &lease)
	if apierrors.IsNotFound(err) {
		return health{healthy: true, reason: reasonNodeHealthy, message: fmt.Sprintf("Node %s is Ready", node.Name)}, nil
	}
	if err != nil {
		return health{}, err
	}
	if lease.Spec.RenewTime != nil && lease.Spec.LeaseDurationSeconds != nil {
		expiry := lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
		if now.After(expiry) {
			return health{reason: reasonNodeLeaseExpired, message: fmt.Sprintf(
				"Node %s's kubelet has not renewed its Lease since %s (lease duration %ds)",
				node.Name, lease.Spec.RenewTime.UTC().Format(time.RFC3339), *lease.Spec.LeaseDurationSeconds)}, nil
		}
		return health{healthy: true, reason: reasonNodeHealthy, message: fmt.Sprintf("Node %s is Ready", node.Name), recheck: expiry}, nil
	}
	return health{healthy: true, reason: reasonNodeHealthy, message: fmt.Sprintf("Node %s is Ready", node.Name)}, nil
}

func nodeCondition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// applyNodeSpec puts the class's and the Machine's labels and taints on the
// Node, writing only when something is missing or different. Labels and
// taints that others set are left alone.
//
// With uncordon, the same patch also makes the Node schedulable again,
// as the end of an operation that drained it.
func (r *Reconciler) applyNodeSpec(ctx context.Context, node *corev1.Node, m *machinistv1.Machine, class *machinistv1.MachineClass, uncordon bool) error {
	labels := map[string]string{}
	var taints []corev1.Taint
	if class != nil && class.Spec.NodeTemplate != nil {
		for k, v := range class.Spec.NodeTemplate.Labels {
			labels[k] = v
		}
		taints = append(taints, class.Spec.NodeTemplate.Taints...)
	}
	for k, v := range m.Spec.NodeLabels {
		labels[k] = v
	}
	for _, t := range m.Spec.NodeTaints {
		taints = setTaint(taints, t)
	}

	// A JSON patch of just what changes. Labels are set key by key, so
	// others' labels stay; taints are one atomic list, so setting them is
	// tested against the list this change was computed from: a taint that
	// the node lifecycle controller, a user or another controller added or
	// removed since the cache saw the Node is never undone by a list from
	// before it (a Conflict, and the change is decided again).
	var p patch.JSON
	for k, v := range labels {
		if have, ok := node.Labels[k]; ok && have == v {
			continue
		}
		if node.Labels == nil {
			p.Set("/metadata/labels", labels)
			break
		}
		p.Set("/metadata/labels/"+patch.Key(k), v)
	}
	want := node.Spec.Taints
	for _, t := range taints {
		want = setTaint(want, t)
	}
	if !equalTaints(node.Spec.Taints, want) {
		var had any // a Node without taints has no such field
		if len(node.Spec.Taints) > 0 {
			had = node.Spec.Taints
		}
		p.Test("/spec/taints", had)
		p.Set("/spec/taints", want)
	}
	if uncordon && node.Spec.Unschedulable {
		p.Set("/spec/unschedulable", false)
	}
	if p.Empty() {
		return nil
	}
	return patch.Conflict(r.Client.Patch(ctx, node.DeepCopy(), p.Patch()))
}

// setTaint adds t, replacing a taint with the same key and effect.
func setTaint(taints []corev1.Taint, t corev1.Taint) []corev1.Taint {
	for i := range taints {
		if taints[i].Key == t.Key && taints[i].Effect == t.Effect {
			if taints[i].Value != t.Value {
				out := append([]corev1.Taint(nil), taints...)
				out[i].Value = t.Value
				return out
			}
			return taints
		}
	}
	return append(append([]corev1.Taint(nil), taints...), t)
}

func equalTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].MatchTaint(&b[i]) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}
