package machinedeployment

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
)

// busyRetry is how soon expiry looks again while a Machine of the
// deployment is out of service: the replacement of the last one expired,
// usually, which takes seconds to minutes.
const busyRetry = 10 * time.Second

// expire replaces a Machine older than spec.expireAfter: one at a time for
// the deployment (none while any of its Machines is out of service, so
// that expiry never takes more than one Machine of the pool down), only
// outside a rollout, and only once the disruption budgets admit it
// (reason Expiry). It deletes the Machine; its MachineSet makes a new one.
// wait is when to look again.
func (r *Reconciler) expire(ctx context.Context, md *machinistv1.MachineDeployment, newSet *machinistv1.MachineSet, old []*machinistv1.MachineSet) (wait time.Duration, err error) {
	if md.Spec.ExpireAfter == nil || md.Spec.Paused || newSet == nil {
		return 0, nil
	}
	for _, ms := range old {
		if ms.Status.Replicas > 0 {
			return 0, nil // a rollout replaces them anyway
		}
	}
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(md.Namespace)); err != nil {
		return 0, err
	}
	now, life := r.now(), md.Spec.ExpireAfter.Duration
	var expired *machinistv1.Machine
	var next time.Time
	busy := false
	for i := range list.Items {
		m := &list.Items[i]
		if ref := metav1.GetControllerOf(m); ref == nil || ref.UID != newSet.UID {
			continue
		}
		if !m.DeletionTimestamp.IsZero() || m.Status.Phase != machinistv1.MachineRunning ||
			!meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady) {
			busy = true
			continue
		}
		at := m.CreationTimestamp.Add(life)
		switch {
		case now.Before(at):
			if next.IsZero() || at.Before(next) {
				next = at
			}
		case expired == nil || m.CreationTimestamp.Before(&expired.CreationTimestamp) ||
			// Created in the same second: by name, so that each look
			// picks the same one.
			m.CreationTimestamp.Equal(&expired.CreationTimestamp) && m.Name < expired.Name:
			expired = m
		}
	}
	if expired == nil {
		r.expiryHolds.Delete(md.UID)
		if next.IsZero() {
			return 0, nil
		}
		return next.Sub(now) + time.Second, nil
	}
	if busy {
		return busyRetry, nil
	}
	if r.APIReader != nil {
		store := disruption.Cached(r.APIReader, r.Client)
		req := disruption.Request{Machine: expired, Reason: machinistv1.DisruptionExpiry, By: "machinedeployment/" + md.Name}
		err := store.Admit(ctx, req, disruption.At(r.Calendar))
		if refusal, ok := disruption.AsRefusal(err); ok {
			// Said when the hold begins, not on every look while the
			// budget is spent; a restarted manager says it once more.
			hold := refusal.Budget
			if last, ok := r.expiryHolds.Swap(md.UID, hold); !ok || last != hold {
				r.event(md, corev1.EventTypeNormal, machinistv1.ReasonDisruptionHeld, "Expire", "not replacing expired Machine %s yet: %s", expired.Name, refusal.Message)
			}
			return refusal.RetryAfter, nil
		}
		if err != nil {
			return 0, err
		}
	}
	r.expiryHolds.Delete(md.UID)
	uid := expired.UID
	if err := r.Client.Delete(ctx, expired, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return 0, err
	}
	r.event(md, corev1.EventTypeNormal, "MachineExpired", "Expire", "replacing Machine %s: older than expireAfter %s", expired.Name, life)
	return busyRetry, nil
}
