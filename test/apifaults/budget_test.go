package apifaults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
)

func budget(ns, name string, max int32) *machinistv1.MachineDisruptionBudget {
	return testenv.Budget(ns, name, "pool", max)
}

// running creates a Machine of the pool and waits until it is Running.
func running(t *testing.T, ns, name string) *machinistv1.Machine {
	t.Helper()
	ctx := context.Background()
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pool": "pool"},
			Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, name+" Running", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil && m.Status.Phase == machinistv1.MachineRunning
	})
	return m
}

func reboot(m *machinistv1.Machine, id string) disruption.Request {
	return disruption.Request{Machine: m, Reason: machinistv1.DisruptionReboot, OperationID: id, By: "test"}
}

// An in-place update whose status write fails must be carried out once,
// and must not leave the budget counting its Machine once it is done: the
// update is stored before the budgets admit it and the provider acts, so
// that whatever write fails after, the record, the operation and the
// provider's restart carry one ID. Otherwise the next look starts a second
// update (a second restart) if the Node has not shown the first yet, or
// none if it has, and the budget's record of the first never ends.
func TestAFailedWriteDuringAnUpdateLeavesNoDisruptionCounted(t *testing.T) {
	c := start(t, 21)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m1, m2 := running(t, ns, "m1"), running(t, ns, "m2")
	if err := env.Client.Create(ctx, budget(ns, "one", 1)); err != nil {
		t.Fatal(err)
	}
	// m1 at rest: its next status write is the update's.
	testenv.WaitFor(t, 30*time.Second, "m1 Ready", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m1), m1) == nil &&
			meta.IsStatusConditionTrue(m1.Status.Conditions, machinistv1.ConditionReady)
	})
	testenv.WaitQuiet(t, env.Client, 30*time.Second, time.Second, "m1", m1)
	// The first status write of m1 once its version changes loses a
	// race to another writer (as to a health check's condition).
	arm(t, 21, faults.Rule{Name: "refused", Fault: faults.Conflict, Verbs: []string{"update", "patch"}, Resources: []string{"machines/status"},
		Names: []string{m1.Name}, Rate: 1, Limit: 1})
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"version":"v1.38.0"}}`))
	if err := env.Client.Patch(ctx, m1, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "m1 updated and Running", func() bool {
		if env.Client.Get(ctx, client.ObjectKeyFromObject(m1), m1) != nil {
			return false
		}
		info := m1.Status.NodeInfo
		return m1.Status.Phase == machinistv1.MachineRunning && info != nil && info.KubeletVersion == "v1.38.0" &&
			(m1.Status.Operation == nil || !isInFlight(m1.Status.Operation))
	})
	if proxy.Struck("refused") != 1 {
		t.Fatal("no status write of m1 was refused: the test proved nothing")
	}
	op := m1.Status.Operation
	t.Logf("m1's operation: %+v", op)
	if op == nil || op.Type != machinistv1.OperationUpdate || op.State != machinistv1.OperationSucceeded {
		t.Errorf("m1 was updated without an Update operation that Succeeded: %+v", op)
	}
	if n, err := c.Provider.Restarts(m1.Status.ProviderID); err != nil || n != 1 {
		t.Errorf("m1's machine was restarted %d times for one update (%v)", n, err)
	}
	// The budget allows one at a time, and nothing is out of service.
	if err := disruption.Direct(env.Client).Admit(ctx, reboot(m2, "reboot-m2"), time.Now()); err != nil {
		var b machinistv1.MachineDisruptionBudget
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one"}, &b)
		t.Fatalf("right after m1's update the budget refused m2: %v; its records: %+v", err, b.Status.Disruptions)
	}
}

func isInFlight(op *machinistv1.Operation) bool {
	return op.State == machinistv1.OperationPending || op.State == machinistv1.OperationRunning
}

// An admission whose reply is lost was recorded although the actor hears
// a failure and will not disrupt: the record must not keep the slot, and
// admitting the same disruption again must count it once.
func TestALostAdmissionReplyHoldsNoSlotAndCountsOnce(t *testing.T) {
	start(t, 22)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m1, m2 := running(t, ns, "m1"), running(t, ns, "m2")
	if err := env.Client.Create(ctx, budget(ns, "one", 1)); err != nil {
		t.Fatal(err)
	}
	// The budget controller has written the budget's counts: the next
	// write of its status is the admission's.
	testenv.WaitFor(t, 30*time.Second, "the budget's counts", func() bool {
		var b machinistv1.MachineDisruptionBudget
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one"}, &b) == nil &&
			b.Status.ObservedGeneration == b.Generation && b.Status.SelectedMachines == 2 && b.Status.DisruptionsAllowed == 1
	})
	testenv.WaitQuiet(t, env.Client, 30*time.Second, time.Second, "the budget",
		&machinistv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one"}})
	arm(t, 22, faults.Rule{Name: "lost-admission", Fault: faults.LoseReply, Verbs: []string{"update"}, Resources: []string{"machinedisruptionbudgets/status"},
		Rate: 1, Limit: 1})
	through, err := client.New(proxy.Config(), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	err = disruption.Direct(through).Admit(ctx, reboot(m1, "reboot-m1"), time.Now())
	if err == nil || proxy.Struck("lost-admission") != 1 {
		t.Fatalf("the admission's reply was not lost (%d struck): %v", proxy.Struck("lost-admission"), err)
	}
	t.Logf("m1's admission: %v", err)
	// m1's actor heard a failure and does nothing: m2 may go.
	if err := disruption.Direct(env.Client).Admit(ctx, reboot(m2, "reboot-m2"), time.Now()); err != nil {
		t.Fatalf("a lost admission reply keeps its slot: %v", err)
	}
	if err := disruption.Direct(env.Client).Release(ctx, reboot(m2, "reboot-m2")); err != nil {
		t.Fatal(err)
	}
	// m1's actor asks again, twice: one record, one disruption.
	for range 2 {
		if err := disruption.Direct(env.Client).Admit(ctx, reboot(m1, "reboot-m1"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var b machinistv1.MachineDisruptionBudget
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one"}, &b); err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, d := range b.Status.Disruptions {
		if d.Machine == m1.Name {
			records++
		}
	}
	if records != 1 {
		t.Fatalf("m1 is recorded %d times: %s", records, fmt.Sprint(b.Status.Disruptions))
	}
}
