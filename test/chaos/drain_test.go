package chaos_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// nodeDeletionTimeout is long enough that the kill and the failover land
// inside the Node deletion's wait.
const nodeDeletionTimeout = 25 * time.Second

// TestKillDuringDeletionWaits deletes a Machine of the workload cluster
// whose instance must wait, in turn, for a drain group a budget holds, a
// volume attached to its Node, a pre-terminate hook and a Node deletion
// that the workload cluster's API refuses, and kills the manager with
// SIGKILL in each wait. Each time the new process resumes the same wait,
// from when it began: a wait lives in the API, not in memory.
func TestKillDuringDeletionWaits(t *testing.T) {
	forEachSeed(t, func(t *testing.T, r *run) {
		ctx := context.Background()
		rep := r.startReplica("a")
		r.waitLeader(rep)
		const hook = machinistv1.PreTerminateHookPrefix + "backup"
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "waits", Labels: map[string]string{"tier": "data"},
				Annotations: map[string]string{hook: ""}},
			Spec: template(nil, "v1.37.2").Spec,
		}
		m.Spec.NodeLabels = map[string]string{"chaos.test/undeletable": r.ns}
		m.Spec.Drain = &machinistv1.DrainSettings{NodeDeletionTimeout: &metav1.Duration{Duration: nodeDeletionTimeout}}
		r.must(env.Client.Create(ctx, m))
		r.must(env.Client.Create(ctx, &machinistv1.MachineDrainRule{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "last"},
			Spec: machinistv1.MachineDrainRuleSpec{
				Behavior: machinistv1.DrainBehaviorDrain, Order: ptr.To[int32](10),
				Machines: []machinistv1.MachineDrainRuleMachineSelector{{Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"tier": "data"}}}},
				Pods: []machinistv1.MachineDrainRulePodSelector{{Selector: &machinistv1.LabelSelector{
					MatchLabels: map[string]string{"app": "last"}}}},
			},
		}))
		var node string
		r.wait("the Machine Running", func() error {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
				return err
			}
			if m.Status.Phase != machinistv1.MachineRunning || m.Status.NodeRef == nil {
				return fmt.Errorf("phase %s", m.Status.Phase)
			}
			node = m.Status.NodeRef.Name
			return nil
		})
		// In the workload cluster: a held pod of order 0, a pod of order
		// 10 behind it, a volume attached to the Node, and a policy that
		// refuses the Node's deletion.
		r.must(workload.HoldDrains(ctx, r.ns, pdbName, node))
		last := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "last", Labels: map[string]string{"app": "last"}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
		}
		r.must(workload.Client.Create(ctx, last))
		va, err := workload.AttachVolume(ctx, r.ns+"-data", node)
		r.must(err)
		allow, err := workload.RefuseNodeDeletion(ctx, "chaos-"+r.ns, "chaos.test/undeletable", r.ns, node)
		r.must(err)
		r.stops = append(r.stops, func() {
			_ = allow(ctx)
			_ = client.IgnoreNotFound(workload.Client.Delete(ctx, va))
			_ = client.IgnoreNotFound(workload.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}))
		})
		r.must(env.Client.Delete(ctx, m))

		// waitFor waits until the Machine shows condition t False for
		// reason, and Ready says the same; it returns when t turned.
		waitFor := func(what, t, reason string) metav1.Time {
			var since metav1.Time
			r.wait(what, func() error {
				got := &machinistv1.Machine{}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
					return err
				}
				c, ready := meta.FindStatusCondition(got.Status.Conditions, t), meta.FindStatusCondition(got.Status.Conditions, machinistv1.ConditionReady)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason || ready == nil || ready.Reason != reason {
					return fmt.Errorf("phase %s, %s %+v, Ready %+v", got.Status.Phase, t, c, ready)
				}
				since = c.LastTransitionTime
				return nil
			})
			return since
		}
		// stillWaits kills the manager and checks, once the new process
		// leads and has had time to look, that the same wait goes on.
		stillWaits := func(what, t, reason string, since metav1.Time, holds func() error) {
			r.killAndLead(rep)
			// On purpose: the new leader's first looks happen meanwhile.
			time.Sleep(3 * time.Second)
			if again := waitFor(what, t, reason); !again.Equal(&since) {
				r.t.Errorf("after the kill the %s wait began again at %s; it began at %s", what, again, since)
			}
			if err := holds(); err != nil {
				r.t.Fatalf("after the kill during the %s wait: %v", what, err)
			}
			r.note("killed the manager during the %s wait; the new one resumed it", what)
		}
		instance := func() error {
			if _, ok := r.books().dirs[m.UID]; !ok {
				return fmt.Errorf("the instance is gone too soon")
			}
			return nil
		}

		since := waitFor("the drain held by the budget on group 0", machinistv1.ConditionDrained, machinistv1.ReasonPodDisruptionBudget)
		stillWaits("drain", machinistv1.ConditionDrained, machinistv1.ReasonPodDisruptionBudget, since, func() error {
			err := workload.Client.Get(ctx, client.ObjectKeyFromObject(last), &corev1.Pod{})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("the order-10 pod was evicted while the order-0 group was held")
			}
			return err
		})
		r.relaxDrains()

		since = waitFor("the volume to detach", machinistv1.ConditionVolumesDetached, machinistv1.ReasonVolumeDetach)
		stillWaits("volume", machinistv1.ConditionVolumesDetached, machinistv1.ReasonVolumeDetach, since, instance)
		r.must(workload.Client.Delete(ctx, va))

		r.wait("the pre-terminate hook to hold the instance", func() error {
			got := &machinistv1.Machine{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
				return err
			}
			if c := meta.FindStatusCondition(got.Status.Conditions, machinistv1.ConditionReady); c == nil || c.Reason != machinistv1.ReasonPreTerminateHook {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
		r.killAndLead(rep)
		time.Sleep(3 * time.Second)
		r.must(instance())
		r.note("killed the manager during the pre-terminate hook's wait; the instance stayed")
		r.must(testenv.Poll(30*time.Second, func() error {
			got := &machinistv1.Machine{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
				return err
			}
			delete(got.Annotations, hook)
			return env.Client.Update(ctx, got)
		}))

		since = waitFor("the refused Node deletion", machinistv1.ConditionNodeDeleted, machinistv1.ReasonNodeDeletion)
		if _, ok := r.books().dirs[m.UID]; ok {
			t.Fatal("the Node's deletion was tried before the instance was deleted")
		}
		stillWaits("node deletion", machinistv1.ConditionNodeDeleted, machinistv1.ReasonNodeDeletion, since, func() error { return nil })
		r.wait("the Machine gone once the node-deletion timeout passed", func() error {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})
		gone := time.Now()
		// The condition's time has whole seconds; the give-up comes at the
		// first look past since+timeout, from the same deadline.
		if early, late := since.Add(nodeDeletionTimeout-time.Second), since.Add(nodeDeletionTimeout+20*time.Second); gone.Before(early) || gone.After(late) {
			t.Errorf("the Machine went at %s, %s after its Node's deletion first failed; the timeout is %s",
				gone.Format(time.RFC3339), gone.Sub(since.Time).Round(time.Second), nodeDeletionTimeout)
		}
		if err := workload.Client.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{}); err != nil {
			t.Errorf("the Node the policy kept: %v", err)
		}
		if exits := rep.unplannedExits(); len(exits) > 0 {
			t.Errorf("the manager exited %d times unbidden; last:\n%s", len(exits), exits[len(exits)-1].Tail)
		}
	})
}

// killAndLead kills the replica's process and waits until the process the
// supervisor starts in its place holds the leader Lease.
func (r *run) killAndLead(rep *replica) {
	r.t.Helper()
	rep.mu.Lock()
	exits := len(rep.exits)
	rep.mu.Unlock()
	rep.kill()
	r.must(testenv.Poll(time.Minute, func() error {
		rep.mu.Lock()
		defer rep.mu.Unlock()
		if len(rep.exits) == exits {
			return fmt.Errorf("the killed process has not exited yet")
		}
		return nil
	}))
	r.waitLeader(rep)
}
