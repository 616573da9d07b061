package healthcheck_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

func budget(ns, pool string, max int32) *machinistv1.MachineDisruptionBudget {
	return &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool},
		Spec: machinistv1.MachineDisruptionBudgetSpec{
			Selector:     machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			MaxDisrupted: intstr.FromInt32(max),
			Reasons:      []machinistv1.DisruptionReason{machinistv1.DisruptionRemediation},
		},
	}
}

// A Machine still in service that a health check would replace waits for
// the disruption budget; one that is down is replaced whatever the budget:
// a dead machine is not a disruption.
func TestReplaceWaitsForTheBudgetUnlessTheMachineIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "budget", "")
	create(t, machineSet(ns, "workers", 2))
	ms := running(t, ns, 2)
	up, dead := ms[0], ms[1]
	create(t, budget(ns, "workers", 0))
	hc := healthCheck(ns, "workers", rung(replace, 0))
	// Room for both: a Replace the budget holds keeps its slot (see
	// docs/disruption.md), which with one slot could keep the broken
	// Machine waiting behind it.
	hc.Spec.Remediation.MaxInFlight = percent("100%")
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
	if err := controllers.Provider.Break(dead.Status.ProviderID); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "the broken Machine replaced", func() bool {
		for _, m := range machines(t, ns) {
			if m.Name == dead.Name {
				return false
			}
		}
		return true
	})
	held := events(t, ns, "DisruptionHeld", 1)
	if len(held) == 0 || !strings.Contains(held[0].Note, "not replacing Machine "+up.Name+" yet: MachineDisruptionBudget workers allows no more disruptions") {
		t.Fatalf("want a DisruptionHeld Event for %s, got %+v", up.Name, held)
	}
	get(t, &up)
	if !up.DeletionTimestamp.IsZero() {
		t.Fatal("the Machine in service was deleted although the budget allows nothing")
	}
	if up.Status.Remediation == nil || up.Status.Remediation.Phase != machinistv1.RemediationReplacing {
		t.Errorf("the held Machine's remediation is %+v, want Replacing", up.Status.Remediation)
	}

	// The budget allows one: the held replacement goes ahead.
	b := budget(ns, "workers", 0)
	get(t, b)
	patch := client.MergeFrom(b.DeepCopy())
	b.Spec.MaxDisrupted = intstr.FromInt32(1)
	if err := env.Client.Patch(ctx, b, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held Machine replaced once allowed", func() bool {
		for _, m := range machines(t, ns) {
			if m.Name == up.Name {
				return false
			}
		}
		return true
	})
}
