package machinehealthcheck

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// verdict is what the checks conclude about one Machine now.
type verdict struct {
	// known is false while the checks cannot judge: an operation is moving
	// the Machine, or the Node's conditions may be stale. Nothing changes
	// on an unknown verdict.
	known   bool
	healthy bool
	reason  string
	message string
	// unreachable: the Node's kubelet does not report (Ready=Unknown), so
	// nothing on the machine can answer a soft reboot or an eviction.
	unreachable bool
	// recheck is when the verdict may change by time alone; zero if only
	// an event can change it.
	recheck time.Time
}

// trust says from when Node conditions are believed. A condition seen
// while the manager was not watching (before it started, or during an
// outage of the API server) may be stale: kubelets could not report and
// the node lifecycle controller marks every Node Unknown. No condition is
// held against a Machine before Since+Grace, and a condition's clock does
// not run before Since.
type trust struct {
	Since time.Time
	Grace time.Duration
}

// checks are a health check's checks, defaults applied.
type checks struct {
	startup    time.Duration
	conditions []machinistv1.UnhealthyNodeCondition
}

func checksOf(spec *machinistv1.MachineHealthCheckSpec) checks {
	c := checks{startup: 10 * time.Minute, conditions: spec.UnhealthyNodeConditions}
	if spec.NodeStartupTimeout != nil {
		c.startup = spec.NodeStartupTimeout.Duration
	}
	return c
}

// judge runs the checks on m, whose Node is node (nil: none found).
func judge(c checks, m *machinistv1.Machine, node *corev1.Node, now time.Time, t trust) verdict {
	switch m.Status.Phase {
	case machinistv1.MachineFailed:
		reason, message := m.Status.Failure()
		return verdict{known: true, reason: machinistv1.ReasonMachineFailed,
			message: fmt.Sprintf("the Machine is Failed (%s): %s", reason, message)}
	case "", machinistv1.MachinePending, machinistv1.MachineProvisioning:
		return startup(c, m, now)
	case machinistv1.MachineRunning:
	default:
		// Draining, Rebooting, Repairing, Deleting: an operation is under
		// way, and it ends in Running or Failed.
		return verdict{}
	}
	trusted := t.Since.Add(t.Grace)
	if bc := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionBootConfirmed); bc != nil &&
		bc.Status == metav1.ConditionUnknown && bc.Reason == machinistv1.ReasonNodeNotSeen {
		return unconfirmed(c, bc, now, t)
	}
	if node == nil {
		if now.Before(trusted) {
			// A cache that has just listed again, after an outage or at
			// the start, may not show a Node that exists.
			return verdict{recheck: trusted}
		}
		name := "its Node"
		if m.Status.NodeRef != nil {
			name = "Node " + m.Status.NodeRef.Name
		}
		return verdict{known: true, reason: machinistv1.ReasonNodeNotFound, message: fmt.Sprintf("the Machine is Running but %s is gone", name)}
	}
	v := verdict{known: true, healthy: true, reason: machinistv1.ReasonPassed, message: "Node " + node.Name + " passes every check"}
	if ready := condition(node, corev1.NodeReady); ready != nil && ready.Status == corev1.ConditionUnknown {
		v.unreachable = true
	}
	for _, rule := range c.conditions {
		nc := condition(node, corev1.NodeConditionType(rule.Type))
		if nc == nil || string(nc.Status) != rule.Status {
			continue
		}
		if now.Before(trusted) {
			// Possibly stale: let the kubelets report first.
			return verdict{recheck: trusted}
		}
		since := nc.LastTransitionTime.Time
		if since.Before(t.Since) {
			since = t.Since
		}
		until := since.Add(rule.Timeout.Duration)
		if now.Before(until) {
			v.recheck = earliest(v.recheck, until)
			continue
		}
		return verdict{known: true, reason: machinistv1.ReasonUnhealthyNodeCondition, unreachable: v.unreachable, message: fmt.Sprintf(
			"Node %s has been %s=%s since %s, longer than %s", node.Name, rule.Type, rule.Status,
			nc.LastTransitionTime.UTC().Format(time.RFC3339), rule.Timeout.Duration)}
	}
	return v
}

// unconfirmed judges a Machine whose last reboot or repair completed on
// its provider's word while its cluster could not be reached (its
// BootConfirmed condition, Unknown, is confirmed): its Node has not
// reported that boot yet, and a repaired machine has yet to join again.
// Like a new Machine it has the startup timeout to, counted from when its
// Node could first report: the later of the boot and the return of what
// the manager watches. Neither time is in the message, which must not
// change from pass to pass.
func unconfirmed(c checks, confirmed *metav1.Condition, now time.Time, t trust) verdict {
	v := verdict{known: true, healthy: true, reason: machinistv1.ReasonPassed,
		message: "booted anew on its provider's word while its cluster could not be reached; waiting for its Node to report that boot"}
	if c.startup <= 0 {
		return v
	}
	began := confirmed.LastTransitionTime.Time
	if t.Since.After(began) {
		began = t.Since
	}
	if until := began.Add(c.startup); now.Before(until) {
		v.recheck = until
		return v
	}
	return verdict{known: true, reason: machinistv1.ReasonNodeStartupTimeout, message: fmt.Sprintf(
		"no Node reported the boot its provider did %s after it could (nodeStartupTimeout)", c.startup)}
}

// startup judges a Machine that has no Ready Node yet.
func startup(c checks, m *machinistv1.Machine, now time.Time) verdict {
	v := verdict{known: true, healthy: true, reason: machinistv1.ReasonPassed, message: "the Machine is being provisioned"}
	if c.startup <= 0 {
		return v
	}
	began := m.CreationTimestamp.Time
	if t := m.Status.LastTransition; t != nil && t.To == machinistv1.MachineProvisioning {
		began = t.Time.Time
	}
	until := began.Add(c.startup)
	if now.Before(until) {
		v.recheck = until
		return v
	}
	return verdict{known: true, reason: machinistv1.ReasonNodeStartupTimeout, message: fmt.Sprintf(
		"no Ready Node %s after provisioning began (nodeStartupTimeout)", c.startup)}
}

func condition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
