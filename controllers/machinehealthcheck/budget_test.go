package machinehealthcheck_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// budget holds the remediations of pool's Machines to max at once.
func budget(ns, pool string, max int32) *machinistv1.MachineDisruptionBudget {
	return testenv.Budget(ns, pool, pool, max, machinistv1.DisruptionRemediation)
}

// A Machine still in service that a health check would replace waits for
// the disruption budget without taking a maxInFlight slot; one that is
// down is replaced whatever the budget (a dead machine is not a
// disruption), in the one slot there is.
func TestReplaceWaitsForTheBudgetUnlessTheMachineIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "budget", "")
	create(t, testenv.MachineSet(ns, "workers", 2))
	ms := running(t, ns, 2)
	up, dead := ms[0], ms[1]
	create(t, budget(ns, "workers", 0))
	hc := healthCheck(ns, "workers", rung(replace, 0))
	// One slot: the Machine in service, found unhealthy first, must not
	// keep it while the budget holds it.
	hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromInt32(1))
	// Unhealthy by a condition a node problem detector would set, while
	// the Node stays Ready: the Machine is still in service.
	hc.Spec.UnhealthyNodeConditions = append(hc.Spec.UnhealthyNodeConditions,
		machinistv1.UnhealthyNodeCondition{Type: "KernelDeadlock", Status: "True", Timeout: metav1.Duration{Duration: time.Second}})
	create(t, hc)

	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: up.Status.NodeRef.Name}, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
		Type: "KernelDeadlock", Status: corev1.ConditionTrue, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	})
	if err := env.Client.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the Machine in service held by the budget", func() bool {
		get(t, &up)
		rem := up.Status.Remediation
		return rem != nil && strings.HasPrefix(rem.Message, "waiting: MachineDisruptionBudget workers allows no more disruptions")
	})
	if err := controllers.Provider.Break(dead.Status.ProviderID); err != nil {
		t.Fatal(err)
	}

	testenv.WaitFor(t, wait, "the broken Machine replaced", func() bool {
		for _, m := range env.Machines(t, ns) {
			if m.Name == dead.Name {
				return false
			}
		}
		return true
	})
	// Said when a hold begins, not on every look (every 10 s while the
	// budget is spent). Once the replacement runs and nothing changes,
	// the hold is said no more: no new Event, and no repeat of one (the
	// Event library writes a repeated Event again as a series).
	testenv.WaitFor(t, wait, "the replacement Running and the hold said again", func() bool {
		ms := env.Machines(t, ns)
		for _, m := range ms {
			if m.Status.Phase != machinistv1.MachineRunning {
				return false
			}
		}
		get(t, &up)
		return len(ms) == 2 && strings.HasPrefix(up.Status.Remediation.Message, "waiting: MachineDisruptionBudget workers")
	})
	said := func() int {
		n := 0
		for _, e := range events(t, ns, "DisruptionHeld", 1) {
			if !strings.Contains(e.Note, "not starting the remediation of Machine "+up.Name+" yet: MachineDisruptionBudget workers allows no more disruptions") {
				t.Fatalf("a DisruptionHeld Event about something else: %s", e.Note)
			}
			n++
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
		return n
	}
	n := said()
	if n < 1 {
		t.Fatal("no DisruptionHeld Event")
	}
	// Nothing is to change now: twelve seconds, looked at every second,
	// in which the hold must not be said again.
	for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if m := said(); m != n {
			t.Fatalf("the hold said again while nothing changed: %d times, then %d", n, m)
		}
	}
	get(t, &up)
	if !up.DeletionTimestamp.IsZero() {
		t.Fatal("the Machine in service was deleted although the budget allows nothing")
	}
	if rem := up.Status.Remediation; rem == nil || rem.Phase != machinistv1.RemediationUnhealthy {
		t.Errorf("the held Machine's remediation is %+v, want Unhealthy: no rung started", rem)
	}

	// The budget allows one: the held replacement goes ahead.
	b := budget(ns, "workers", 0)
	get(t, b)
	patch := client.MergeFrom(b.DeepCopy())
	b.Spec.MaxDisrupted = intstr.FromInt32(1)
	if err := env.Client.Patch(ctx, b, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the held Machine replaced once allowed", func() bool {
		for _, m := range env.Machines(t, ns) {
			if m.Name == up.Name {
				return false
			}
		}
		return true
	})
}
