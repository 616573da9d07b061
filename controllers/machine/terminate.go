package machine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/nodes"
)

// The waits between a drain and what destroys or re-images an instance.
// Each says what it waits for in a condition and in the Ready condition,
// and keeps when it began in the API (the condition's lastTransitionTime),
// so that a restarted manager resumes the same wait with the same
// deadline. A wait writes the Machine when what it waits for changes, not
// per look.

// awaitVolumes reports whether no VolumeAttachment names the Machine's
// Node any more, or the volume-detach timeout has passed since the wait
// began; then says after what ("deleting"). A Machine that never had a
// Node has no volumes to wait for.
func (r *Reconciler) awaitVolumes(ctx context.Context, s *step, next string) (bool, error) {
	m := s.m
	if m.Status.NodeRef == nil {
		return true, nil
	}
	prev := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionVolumesDetached)
	if prev != nil && prev.Status == metav1.ConditionFalse &&
		(prev.Reason == machinistv1.ReasonVolumeDetachTimeout || prev.Reason == machinistv1.ReasonVolumeDetachSkipped) {
		if prev.LastTransitionTime.Time.Before(s.enteredAt()) {
			// An earlier operation's end: this wait starts afresh.
			meta.RemoveStatusCondition(&m.Status.Conditions, machinistv1.ConditionVolumesDetached)
			prev = nil
		} else if prev.Reason == machinistv1.ReasonVolumeDetachTimeout {
			// Given up in this very phase already (a later step failed
			// since): not begun again.
			return true, nil
		}
	}
	set := func(status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionVolumesDetached, Status: status, Reason: reason, Message: message, ObservedGeneration: m.Generation,
		})
	}
	node := m.Status.NodeRef.Name
	if s.down != nil {
		// Which volumes are attached cannot be known; the wait, and its
		// timeout, go on.
		msg := fmt.Sprintf("%s: whether volumes are still attached to Node %s cannot be known", s.down.Unseen(), node)
		set(metav1.ConditionFalse, machinistv1.ReasonClusterUnreachable, msg)
		setReadyWait(s, machinistv1.ReasonVolumeDetach, msg)
		return r.volumeTimeout(s, prev, msg, next), nil
	}
	names, err := s.nodes.VolumeAttachments(ctx, node)
	if err != nil {
		return false, err
	}
	if len(names) == 0 {
		if prev != nil {
			// Only a Machine that waited says so: one that never had to
			// costs no word.
			set(metav1.ConditionTrue, machinistv1.ReasonVolumesDetached, fmt.Sprintf("no VolumeAttachment names Node %s", node))
		}
		return true, nil
	}
	shown := names[:min(len(names), 3)]
	listed := strings.Join(shown, ", ")
	if n := len(names) - len(shown); n > 0 {
		listed += fmt.Sprintf(" and %d more", n)
	}
	if why, err := unreachableNode(ctx, s); err != nil || why != "" {
		if err != nil {
			return false, err
		}
		// Volumes are detached through the kubelet, which no longer
		// answers: waiting would hold a dead machine's deletion or repair
		// for as long as the attachments stay, which is for ever.
		msg := fmt.Sprintf("not waited for: %s, so its %d VolumeAttachment(s) cannot be detached through it: %s", why, len(names), listed)
		if prev == nil || prev.Reason != machinistv1.ReasonVolumeDetachSkipped {
			s.note(corev1.EventTypeWarning, machinistv1.ReasonVolumeDetachSkipped, "VolumeDetach", "%s; %s", msg, next)
		}
		set(metav1.ConditionFalse, machinistv1.ReasonVolumeDetachSkipped, msg)
		return true, nil
	}
	msg := fmt.Sprintf("waiting for %d VolumeAttachment(s) naming Node %s to go: %s", len(names), node, listed)
	set(metav1.ConditionFalse, machinistv1.ReasonVolumeDetach, msg)
	setReadyWait(s, machinistv1.ReasonVolumeDetach, msg)
	return r.volumeTimeout(s, prev, msg, next), nil
}

// unreachableNode says why the Machine's Node cannot be reached (a Ready
// condition Unknown, as the node lifecycle controller marks a silent
// kubelet, or a kubelet Lease not renewed in time), or "" when it can,
// or when there is no Node.
func unreachableNode(ctx context.Context, s *step) (string, error) {
	node, err := s.nodes.Node(ctx, s.m.Status.ProviderID)
	if err != nil || node == nil {
		return "", err
	}
	if c := nodes.Condition(node, corev1.NodeReady); c != nil && c.Status == corev1.ConditionUnknown {
		return fmt.Sprintf("Node %s is unreachable (Ready=Unknown: %s)", node.Name, c.Reason), nil
	}
	h, err := nodes.Judge(ctx, s.nodes, node, s.now)
	if err != nil || h.Reason != machinistv1.ReasonNodeLeaseExpired {
		return "", err
	}
	return fmt.Sprintf("Node %s is unreachable (%s)", node.Name, h.Message), nil
}

// volumeTimeout reports whether the volume wait, which began when prev
// (the condition before this look) says, has run out of time; if not,
// it asks to look again.
func (r *Reconciler) volumeTimeout(s *step, prev *metav1.Condition, msg, next string) bool {
	m := s.m
	start := s.now
	if prev != nil && prev.Status == metav1.ConditionFalse {
		start = prev.LastTransitionTime.Time
	}
	timeout := effectiveDrain(m, s.class).VolumeDetachTimeout
	if timeout != nil && timeout.Duration > 0 {
		deadline := start.Add(timeout.Duration)
		if !s.now.Before(deadline) {
			why := fmt.Sprintf("volume-detach timeout %s passed; %s anyway: %s", timeout.Duration, next, msg)
			meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
				Type: machinistv1.ConditionVolumesDetached, Status: metav1.ConditionFalse,
				Reason: machinistv1.ReasonVolumeDetachTimeout, Message: why, ObservedGeneration: m.Generation,
			})
			s.note(corev1.EventTypeWarning, machinistv1.ReasonVolumeDetachTimeout, "VolumeDetach", "%s", why)
			return true
		}
		s.after(deadline.Sub(s.now))
	}
	if s.down != nil {
		s.after(downPoll)
	} else {
		s.after(r.drainRecheck(s.now.Sub(start)))
	}
	return false
}

// preTerminateHooks lists the hooks holding m's instance, sorted.
func preTerminateHooks(m *machinistv1.Machine) []string {
	var hooks []string
	for k := range m.Annotations {
		if strings.HasPrefix(k, machinistv1.PreTerminateHookPrefix) {
			hooks = append(hooks, k)
		}
	}
	slices.Sort(hooks)
	return hooks
}

// instanceDeleted reports whether m's instance is known gone: its Node's
// deletion has been tried since.
func instanceDeleted(m *machinistv1.Machine) bool {
	return meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeDeleted) != nil
}

// nodeDeletionFailed records that the deletion of node, whose instance is
// gone, failed with err, and reports whether the node-deletion timeout has
// passed since the first failure: the Node is then given up, with a
// Warning Event, and the Machine goes.
func (r *Reconciler) nodeDeletionFailed(s *step, node string, err error) bool {
	m := s.m
	prev := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeDeleted)
	start := s.now
	if prev != nil {
		start = prev.LastTransitionTime.Time
	}
	msg := fmt.Sprintf("the instance is deleted; deleting Node %s failed: %v", node, err)
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionNodeDeleted, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonNodeDeletion,
		Message: msg, ObservedGeneration: m.Generation,
	})
	timeout := nodeDeletionTimeout(effectiveDrain(m, s.class))
	if timeout > 0 {
		deadline := start.Add(timeout)
		if !s.now.Before(deadline) {
			s.note(corev1.EventTypeWarning, machinistv1.ReasonNodeDeletionTimeout, "DeleteNode",
				"gave up deleting Node %s after the node-deletion timeout of %s: %v", node, timeout, err)
			return true
		}
		s.after(deadline.Sub(s.now))
	}
	setReadyWait(s, machinistv1.ReasonNodeDeletion, msg)
	s.after(r.drainRecheck(s.now.Sub(start)))
	return false
}

// nodeDeletionTimeout is how long a Node's deletion is tried: the drain
// settings' nodeDeletionTimeout, 10s when unset, no limit when zero.
func nodeDeletionTimeout(settings machinistv1.DrainSettings) time.Duration {
	if settings.NodeDeletionTimeout == nil {
		return machinistv1.DefaultNodeDeletionTimeout
	}
	return settings.NodeDeletionTimeout.Duration
}
