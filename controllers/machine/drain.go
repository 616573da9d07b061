package machine

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/nodes/drain"
)

// drainFor is the handler of a live Machine in Draining: it empties the
// Machine for the operation in flight, then calls the provider; without
// one, or past the operation's own timeout, it gives up and returns the
// Machine to service.
func (r *Reconciler) drainFor(ctx context.Context, s *step) outcome {
	// A Machine that is not being deleted drains only for an operation.
	op := s.m.Status.Operation
	if s.down != nil {
		// Neither draining nor giving up can be done: giving up
		// uncordons the Node. The operation's timeout is judged once
		// the cluster answers.
		return waitToDrain(s)
	}
	if !operation.InFlight(op) {
		// Its record was lost or cleared by hand: back to service.
		return r.abort(ctx, s, "no reboot or repair is in flight")
	}
	if d := operation.Deadline(op); !d.IsZero() {
		if !s.now.Before(d) {
			return r.abort(ctx, s, fmt.Sprintf("the %s's timeout of %ds passed while draining: %s", operation.Verb(op.Type),
				*op.Options.TimeoutSeconds, conditionMessage(s.m, machinistv1.ConditionDrained)))
		}
		s.after(d.Sub(s.now))
	}
	doing := operation.Gerund(operation.Verb(op.Type))
	done, err := r.drain(ctx, s, doing)
	if err != nil || !done {
		return outcome{reason: "draining", err: err}
	}
	if op.Type == machinistv1.OperationRepair {
		// A re-imaged machine loses what its disks held: volumes go
		// first, as before a deletion. A reboot keeps its disks, and the
		// kubelet mounts them again.
		done, err := r.awaitVolumes(ctx, s, doing)
		if err != nil || !done {
			return outcome{reason: "waiting for volumes to detach", err: err}
		}
	}
	return r.callProvider(ctx, s)
}

// waitToDrain has a Machine whose cluster cannot be reached wait in
// Draining for it: pods cannot be evicted through an API that does not
// answer, and going on without evicting them is a person's choice to make
// (a reboot or repair asked for without drain), not the controller's.
func waitToDrain(s *step) outcome {
	setUnseenHealth(s)
	return s.unseen(machinistv1.ConditionDrained, metav1.ConditionFalse,
		"the drain waits for it, since pods cannot be evicted through an API that does not answer")
}

// drain does one round of draining and reports whether it is over; next
// says what happens after a drain that timed out ("deleting"). While it
// waits, the Machine's Ready condition is False with the Drained
// condition's reason, so that the wait shows in kubectl get machines.
func (r *Reconciler) drain(ctx context.Context, s *step, next string) (bool, error) {
	m := s.m
	setDrained := func(status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionDrained, Status: status, Reason: reason, Message: message, ObservedGeneration: m.Generation,
		})
	}
	waiting := func(reason, message string) {
		setDrained(metav1.ConditionFalse, reason, message)
		setReadyWait(s, reason, message)
	}
	if hooks := hooks(m, machinistv1.PreDrainHookPrefix); len(hooks) > 0 {
		waiting(machinistv1.ReasonPreDrainHook, fmt.Sprintf("waiting for pre-drain hook annotation(s) to be removed: %v", hooks))
		return false, nil
	}
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return false, err
	}
	if node == nil {
		setDrained(metav1.ConditionTrue, machinistv1.ReasonDrained, "the Machine has no Node to drain")
		return true, nil
	}
	h, err := nodes.Judge(ctx, s.nodes, node, s.now)
	if err != nil {
		return false, err
	}
	// Ready is set once, by what the round concludes: health when the
	// drain goes on, the wait when it waits. Set twice, it would turn
	// and turn back, and its new transition time would cost a write per
	// round.
	setCondition(m, machinistv1.ConditionNodeHealthy, h)
	settings := effectiveDrain(m, s.class)
	if op := m.Status.Operation; operation.InFlight(op) && op.Options != nil && op.Options.GracePeriodSeconds != nil {
		settings.GracePeriodSeconds = op.Options.GracePeriodSeconds
	}
	var list machinistv1.MachineDrainRuleList
	if err := r.Client.List(ctx, &list, client.InNamespace(m.Namespace)); err != nil {
		return false, fmt.Errorf("listing MachineDrainRules: %w", err)
	}
	rules, err := drain.For(m, list.Items)
	if err != nil {
		// A rule the drain cannot read might be the one that keeps a
		// pod: nothing is evicted until it is fixed.
		waiting(machinistv1.ReasonDrainRuleInvalid, err.Error())
		s.after(r.drainRecheck(s.now.Sub(s.enteredAt())))
		return false, nil
	}
	prev := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionDrained)
	out, err := s.nodes.Drain(ctx, node, settings, h.Healthy, rules)
	if err != nil {
		return false, err
	}
	if out.Plan != "" && !draining(prev) {
		// Once per drain: which rule or label put which pods where.
		s.note(corev1.EventTypeNormal, reasonDrainPlan, "Drain", "%s", out.Plan)
	}
	if out.Done {
		setHealth(m, h)
		setDrained(metav1.ConditionTrue, out.Reason, out.Message)
		return true, nil
	}
	if deadline := drainDeadline(s.enteredAt(), settings); !deadline.IsZero() {
		if !s.now.Before(deadline) {
			msg := fmt.Sprintf("drain timeout %s passed; %s anyway: %s", settings.Timeout.Duration, next, out.Message)
			setHealth(m, h)
			setDrained(metav1.ConditionFalse, machinistv1.ReasonDrainTimeout, msg)
			if r.Recorder != nil {
				r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, machinistv1.ReasonDrainTimeout, "Drain", msg)
			}
			return true, nil
		}
	}
	waiting(out.Reason, out.Message)
	s.after(r.drainRecheck(s.now.Sub(s.enteredAt())))
	return false, nil
}

// reasonDrainPlan is the reason of the Event that says what drain rules
// and pod labels decided for a drain.
const reasonDrainPlan = "DrainPlan"

// draining reports whether c, a Machine's Drained condition, says a drain
// has evicted pods already: its plan was told then.
func draining(c *metav1.Condition) bool {
	return c != nil && c.Status == metav1.ConditionFalse && (c.Reason == machinistv1.ReasonDraining ||
		c.Reason == machinistv1.ReasonPodDisruptionBudget || c.Reason == machinistv1.ReasonWaitCompleted)
}

// setReadyWait says, in the Machine's Ready condition, what it waits for.
func setReadyWait(s *step, reason, message string) {
	meta.SetStatusCondition(&s.m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message,
		ObservedGeneration: s.m.Generation,
	})
}

// drainRecheck is how long to wait before the next round of a drain that
// has gone on for elapsed: DrainPoll at first, then a quarter of the time
// spent, up to 30 s. A drain that a PodDisruptionBudget holds for long
// then asks for evictions a few times a minute, not every DrainPoll.
func (r *Reconciler) drainRecheck(elapsed time.Duration) time.Duration {
	return max(r.drainPoll(), min(elapsed/4, 30*time.Second))
}

// conditionMessage is the message of m's condition t, or "".
func conditionMessage(m *machinistv1.Machine, t string) string {
	if c := meta.FindStatusCondition(m.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

// effectiveDrain merges a Machine's drain settings over its class's.
func effectiveDrain(m *machinistv1.Machine, class *machinistv1.MachineClass) machinistv1.DrainSettings {
	var s machinistv1.DrainSettings
	if class != nil && class.Spec.Drain != nil {
		s = *class.Spec.Drain.DeepCopy()
	}
	if d := m.Spec.Drain; d != nil {
		if d.Timeout != nil {
			s.Timeout = d.Timeout
		}
		if d.GracePeriodSeconds != nil {
			s.GracePeriodSeconds = d.GracePeriodSeconds
		}
		if d.VolumeDetachTimeout != nil {
			s.VolumeDetachTimeout = d.VolumeDetachTimeout
		}
		if d.NodeDeletionTimeout != nil {
			s.NodeDeletionTimeout = d.NodeDeletionTimeout
		}
	}
	return s
}

// drainDeadline is when a drain that started at start must give up, or
// zero for no limit.
func drainDeadline(start time.Time, settings machinistv1.DrainSettings) time.Time {
	if settings.Timeout == nil || settings.Timeout.Duration <= 0 {
		return time.Time{}
	}
	return start.Add(settings.Timeout.Duration)
}

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
