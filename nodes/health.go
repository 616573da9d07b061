package nodes

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Health is what the Machine controller concludes about a Node.
type Health struct {
	Healthy bool
	// Reason is one of the NodeHealthy condition's reasons
	// (machinistv1.ReasonNode*); Message says it for people.
	Reason  string
	Message string
}

// Judge judges node as Kubernetes' node lifecycle controller would: Ready,
// and a kubelet Lease renewed within its duration. The Lease matters
// because a dead kubelet cannot report itself NotReady. A nil node has no
// health.
func Judge(ctx context.Context, c Cluster, node *corev1.Node, now time.Time) (Health, error) {
	if node == nil {
		return Health{Reason: machinistv1.ReasonNodeNotFound, Message: "no Node has this Machine's providerID"}, nil
	}
	ready := Condition(node, corev1.NodeReady)
	if ready != nil && ready.Status == corev1.ConditionUnknown {
		// Unknown is how Kubernetes' node lifecycle controller marks a
		// dead kubelet's Node; the Lease says why better than the
		// condition does.
		if h, err := leaseHealth(ctx, c, node, now); err != nil || !h.Healthy {
			return h, err
		}
	}
	if ready == nil || ready.Status != corev1.ConditionTrue {
		msg := "the Node has not reported Ready"
		if ready != nil {
			msg = fmt.Sprintf("Node %s is Ready=%s: %s", node.Name, ready.Status, ready.Message)
		}
		return Health{Reason: machinistv1.ReasonNodeNotReady, Message: msg}, nil
	}
	return leaseHealth(ctx, c, node, now)
}

// leaseHealth judges a Node by its kubelet's Lease alone.
func leaseHealth(ctx context.Context, c Cluster, node *corev1.Node, now time.Time) (Health, error) {
	healthy := Health{Healthy: true, Reason: machinistv1.ReasonNodeReady, Message: fmt.Sprintf("Node %s is Ready", node.Name)}
	lease, err := c.Lease(ctx, node.Name)
	if err != nil || lease == nil {
		return healthy, err
	}
	if expiry, ok := LeaseExpiry(lease); ok && now.After(expiry) {
		return Health{Reason: machinistv1.ReasonNodeLeaseExpired, Message: fmt.Sprintf(
			"Node %s's kubelet has not renewed its Lease since %s (lease duration %ds)",
			node.Name, lease.Spec.RenewTime.UTC().Format(time.RFC3339), *lease.Spec.LeaseDurationSeconds)}, nil
	}
	return healthy, nil
}

// LeaseExpiry is when a kubelet's lease expires unless renewed; false when
// it says neither when it was renewed nor for how long.
func LeaseExpiry(lease *coordinationv1.Lease) (time.Time, bool) {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second), true
}

// Condition returns node's condition of type t, or nil.
func Condition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// Ready reports whether node reports Ready=True.
func Ready(node *corev1.Node) bool {
	c := Condition(node, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}
