package machine

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
)

// startDeleting is the handler of a deleted Machine that is not Running:
// whatever it was doing, its instance goes now.
func (r *Reconciler) startDeleting(context.Context, *step) outcome { return advance(phases.Delete) }

// drainBeforeDeleting is the handler of a deleted Machine that is
// Running: its pods are evicted before its instance goes.
func (r *Reconciler) drainBeforeDeleting(context.Context, *step) outcome {
	return advance(phases.Drain)
}

// drainToDelete is the handler of a deleted Machine in Draining: once the
// drain is over (or its timeout passed), the instance goes.
func (r *Reconciler) drainToDelete(ctx context.Context, s *step) outcome {
	if s.down != nil {
		return waitToDrain(s)
	}
	done, err := r.drain(ctx, s, "deleting")
	if err != nil || !done {
		return outcome{reason: "draining before deletion", err: err}
	}
	return advance(phases.Delete)
}

// awaitDeletion is the handler of a live Machine in Deleting, which only
// a status written by hand makes: it destroys nothing until the Machine is
// really deleted.
func (r *Reconciler) awaitDeletion(_ context.Context, s *step) outcome {
	return s.wait("Deleting, but the Machine is not being deleted", 0)
}

// destroy is Deleting's handler. It waits for the volumes attached to the
// Machine's Node to detach and for pre-terminate hooks to be removed, then
// destroys the instance, deletes the Node (giving it up after the
// node-deletion timeout) and lets the Machine go by removing its
// finalizer.
func (r *Reconciler) destroy(ctx context.Context, s *step) outcome {
	m := s.m
	if !instanceDeleted(m) {
		if o, done := r.terminate(ctx, s); !done {
			return o
		}
	}
	if s.down != nil {
		// The instance is gone; its Node (or its bootstrap token) is
		// deleted from the cluster it is in, and the finalizer kept
		// until then.
		return s.unseen(machinistv1.ConditionReady, metav1.ConditionFalse,
			"the instance is deleted; its Node is deleted, and the Machine let go, once the cluster answers")
	}
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	if node != nil {
		err := s.nodes.Delete(ctx, node)
		if nodes.Unreachable(err) {
			// Not refused: not heard. The cluster's prober judges an
			// outage; the node-deletion timeout bounds refusals only.
			return fail(err)
		}
		if err != nil && !r.nodeDeletionFailed(s, node.Name, err) {
			return s.wait("deleting the Node", 0)
		}
	}
	if m.Status.NodeRef == nil || m.Status.KeptToken != nil {
		// It never joined, or its repaired machine has not yet: its
		// bootstrap tokens must not outlive it.
		if err := r.spent(ctx, s); err != nil {
			return fail(err)
		}
	}
	if err := r.dropUnrecordedKeptToken(ctx, m); err != nil {
		return fail(err)
	}
	// Deleted is stored by no status: the Machine is gone with it. If the
	// finalizer stays (a conflict, a refusal), the Machine is still
	// Deleting, and nothing has moved.
	status := m.Status.DeepCopy()
	controllerutil.RemoveFinalizer(m, machinistv1.MachineFinalizer)
	if err := r.Client.Update(ctx, m); err != nil {
		m.Status = *status
		return fail(client.IgnoreNotFound(err))
	}
	// The update answers with the stored status; the move is made from
	// what this reconcile decided.
	m.Status = *status
	if len(m.Finalizers) == 0 {
		// Gone from the API server, not yet from the cache: an event
		// meanwhile (its Node's deletion) must not delete it again.
		r.writes.Removed(m)
	} else {
		r.writes.Wrote(m)
	}
	s.gone = true
	return settle(phases.Deleted)
}

// terminate waits for volumes and pre-terminate hooks, then destroys the
// instance; it reports whether the instance is gone, and otherwise the
// outcome to end the reconcile with.
func (r *Reconciler) terminate(ctx context.Context, s *step) (outcome, bool) {
	m := s.m
	done, err := r.awaitVolumes(ctx, s, "deleting")
	if err != nil {
		return fail(err), false
	}
	if !done {
		return s.wait("waiting for volumes to detach", 0), false
	}
	if hooks := hooks(m, machinistv1.PreTerminateHookPrefix); len(hooks) > 0 {
		// Their removal changes the Machine, which wakes it.
		setReadyWait(s, machinistv1.ReasonPreTerminateHook,
			fmt.Sprintf("waiting for pre-terminate hook annotation(s) to be removed: %v", hooks))
		return s.wait("pre-terminate hooks hold the instance", 0), false
	}
	if m.Status.ProviderID == "" {
		id, err := r.findInstance(ctx, m)
		if err != nil {
			return r.retry(s, machinistv1.ReasonDeleteError, err), false
		}
		m.Status.ProviderID = id
	}
	if m.Status.ProviderID != "" {
		act, why := r.actuatorFor(m, s.class)
		if why != nil {
			return r.retry(s, why.reason, why.err), false
		}
		if err := act.Delete(ctx, m.Status.ProviderID); err != nil {
			return r.retry(s, machinistv1.ReasonDeleteError, err), false
		}
		exists, err := act.Exists(ctx, m.Status.ProviderID)
		if err != nil || exists {
			if err == nil {
				err = fmt.Errorf("instance %s still exists", m.Status.ProviderID)
			}
			return r.retry(s, machinistv1.ReasonDeleteError, err), false
		}
	}
	return outcome{}, true
}

// findInstance asks every provider for an instance made for m, which has
// no providerID stored: Create may have succeeded without its answer being
// recorded, and m's class (or which provider it named) may have changed
// since. "" means no provider has one.
func (r *Reconciler) findInstance(ctx context.Context, m *machinistv1.Machine) (string, error) {
	for _, name := range r.Actuators.Names() {
		act, err := r.Actuators.Get(name)
		if err != nil {
			continue
		}
		id, err := act.FindByUID(ctx, m.UID)
		if err != nil {
			return "", fmt.Errorf("asking provider %q for the instance of Machine UID %s: %w", name, m.UID, err)
		}
		if id != "" {
			return id, nil
		}
	}
	return "", nil
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
