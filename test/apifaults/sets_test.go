package apifaults

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A Create whose reply is lost was stored: the set must not count it as
// never coming and create another in its place.
func TestLostCreateRepliesCreateNoExtraMachine(t *testing.T) {
	const n = 60
	start(t, 11, faults.Rule{Name: "lost-creates", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.2})
	ns, ms, seen := emptySet(t)
	scale(t, ms, n)
	settled(t, ns, n, 2*time.Minute)
	created, deleting := seen.counts()
	t.Logf("%d Creates lost their reply; %d Machines created, %d deleted, for %d replicas",
		proxy.Struck("lost-creates"), created, deleting, n)
	if proxy.Struck("lost-creates") == 0 {
		t.Fatal("no Create lost its reply: the test proved nothing")
	}
	if created != n || deleting != 0 {
		t.Fatalf("the set created %d Machines and deleted %d for %d replicas: a lost reply was taken for a Create that never happened", created, deleting, n)
	}
}

// A Create whose reply is lost only after the set's watch has shown the
// Machine leaves the set unsure of a Machine it already counts. When the
// set next grows, repeating that Create finds the Machine there: it must
// not count it a second time as the Machine of the new slot, which would
// leave the set one short with nothing to wake it.
func TestACreateReplyLostAfterTheWatchShowedItIsNotCountedTwice(t *testing.T) {
	start(t, 17, faults.Rule{Name: "lost-late", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"},
		Rate: 1, Limit: 1, Delay: metav1.Duration{Duration: 3 * watchLag}})
	ns, ms, seen := emptySet(t)
	scale(t, ms, 1)
	settled(t, ns, 1, time.Minute)
	if proxy.Struck("lost-late") != 1 {
		t.Fatal("the Create did not lose its reply: the test proved nothing")
	}
	// Long after the set's last status write, so that the write the
	// growth makes is not put off (which would look again a second later).
	testenv.WaitQuiet(t, env.Client, 30*time.Second, 2*time.Second, "the set", ms)
	scale(t, ms, 2)
	settled(t, ns, 2, 30*time.Second)
	if created, deleting := seen.counts(); created != 2 || deleting != 0 {
		t.Fatalf("the set created %d Machines and deleted %d for 2 replicas", created, deleting)
	}
}

// A Create answered 504 is stored later: the set must neither create a
// second Machine for the slot nor stall until the late one shows.
func TestLateCreatesCreateNoExtraMachine(t *testing.T) {
	const n = 30
	start(t, 12, faults.Rule{Name: "late-creates", Fault: faults.LateCommit, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.2,
		Delay: metav1.Duration{Duration: 2 * time.Second}})
	ns, ms, seen := emptySet(t)
	scale(t, ms, n)
	settled(t, ns, n, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := proxy.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing is to happen now: what a late Create stored after the set
	// had settled would show within twice the watch's lag.
	time.Sleep(2 * watchLag)
	settled(t, ns, n, time.Minute)
	created, deleting := seen.counts()
	stored, refused := proxy.Late()
	t.Logf("%d Creates answered 504 (%d stored later, %d refused as already there); %d Machines created, %d deleted, for %d replicas",
		proxy.Struck("late-creates"), stored, refused, created, deleting, n)
	if proxy.Struck("late-creates") == 0 {
		t.Fatal("no Create was answered 504: the test proved nothing")
	}
	if created != n || deleting != 0 {
		t.Fatalf("the set created %d Machines and deleted %d for %d replicas", created, deleting, n)
	}
}

// A Delete whose reply is lost marked its Machine for deletion: the set
// must not pick another victim in its place. The set shrinks one Machine
// at a time, so that a lost reply is often a step's only Delete.
func TestLostDeleteRepliesDeleteNoExtraMachine(t *testing.T) {
	const from, to = 12, 4
	start(t, 13, faults.Rule{Name: "lost-deletes", Fault: faults.LoseReply, Verbs: []string{"delete"}, Resources: []string{"machines"}, Rate: 0.5})
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	seen := watchMachines(t, ns)
	ms := testenv.MachineSet(ns, "pool", from)
	if err := env.Client.Create(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
	settled(t, ns, from, 2*time.Minute)
	for n := from - 1; n >= to; n-- {
		scale(t, ms, int32(n))
		testenv.WaitFor(t, time.Minute, "the set to shrink", func() bool { return len(live(t, ns)) <= n })
	}
	settled(t, ns, to, 2*time.Minute)
	created, deleting := seen.counts()
	t.Logf("%d Deletes lost their reply; %d Machines deleted and %d created on the way from %d to %d",
		proxy.Struck("lost-deletes"), deleting, created-from, from, to)
	if proxy.Struck("lost-deletes") == 0 {
		t.Fatal("no Delete lost its reply: the test proved nothing")
	}
	if deleting != from-to || created != from {
		t.Fatalf("scaling from %d to %d deleted %d Machines and created %d: a lost reply was taken for a Delete that never happened",
			from, to, deleting, created-from)
	}
}

// A status write answered 504 and stored seconds later must not leave the
// set's status older than the world once everything has settled.
func TestALateStatusWriteLeavesTheStatusTrue(t *testing.T) {
	const n = 3
	start(t, 14)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ms := testenv.MachineSet(ns, "pool", 0)
	ctx := context.Background()
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	got := &machinistv1.MachineSet{}
	testenv.WaitFor(t, 10*time.Second, "the set's first status", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ms), got) == nil && got.Status.ObservedGeneration == got.Generation
	})
	// The first status write of the scale-up comes late.
	arm(t, 14, faults.Rule{Name: "late-status", Fault: faults.LateCommit, Verbs: []string{"patch", "update"}, Resources: []string{"machinesets/status"},
		Rate: 1, Limit: 1, Delay: metav1.Duration{Duration: 3 * time.Second}})
	scale(t, ms, n)
	settled(t, ns, n, time.Minute)
	settle, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proxy.Settle(settle); err != nil {
		t.Fatal(err)
	}
	stored, refused := proxy.Late()
	t.Logf("%d status writes answered 504: %d stored later, %d refused", proxy.Struck("late-status"), stored, refused)
	if proxy.Struck("late-status") != 1 {
		t.Fatal("no status write was answered 504: the test proved nothing")
	}
	// Settled: the status must say so, and go on saying so.
	true3 := func(st machinistv1.MachineSetStatus) bool {
		c := meta.FindStatusCondition(st.Conditions, machinistv1.ConditionReady)
		return st.Replicas == n && st.ReadyReplicas == n && st.AvailableReplicas == n && c != nil && c.Status == metav1.ConditionTrue
	}
	testenv.WaitFor(t, 10*time.Second, "the status to say 3 Ready", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ms), got) == nil && true3(got.Status)
	})
	// Nothing is to change now: three seconds, looked at every 100ms.
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ms), got); err != nil {
			t.Fatal(err)
		}
		if !true3(got.Status) {
			t.Fatalf("after the late write the status says %d Machines, %d Ready, %d available, %v; there are %d, all Ready",
				got.Status.Replicas, got.Status.ReadyReplicas, got.Status.AvailableReplicas, got.Status.Conditions, n)
		}
	}
}

// A set's status is its controller's alone: written by anyone else (or
// by a write of its own stored after a newer one), it is set right.
func TestAStatusWrittenByAnotherIsSetRight(t *testing.T) {
	const n = 2
	start(t, 15)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	ms := testenv.MachineSet(ns, "pool", n)
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	settled(t, ns, n, time.Minute)
	got := &machinistv1.MachineSet{}
	testenv.WaitFor(t, 10*time.Second, "the status to say 2 Ready", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ms), got) == nil && got.Status.ReadyReplicas == n
	})
	wrong := client.RawPatch(types.MergePatchType, []byte(`{"status":{"readyReplicas":7,"availableReplicas":7}}`))
	if err := env.Client.Status().Patch(ctx, got, wrong); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the status set right", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ms), got) == nil && got.Status.ReadyReplicas == n && got.Status.AvailableReplicas == n
	})
}

// Whether a set's earlier writes are all in the cache must be asked before
// the cache is read, not after: Machines the set created that arrive in
// between would otherwise be counted neither as awaited nor as owned, and
// created again. The window is widest when the reconcile writes on the way,
// as it does adopting an orphan; here that write takes a second.
func TestAnAdoptionDuringAScaleUpCreatesNoExtraMachine(t *testing.T) {
	const n = 20
	start(t, 16, faults.Rule{Name: "slow-adoption", Fault: faults.Latency, Verbs: []string{"patch"}, Resources: []string{"machines"},
		Rate: 1, Limit: 1, Delay: metav1.Duration{Duration: time.Second}})
	ctx := context.Background()
	ns, ms, seen := emptySet(t)
	scale(t, ms, n)
	orphan := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan", Labels: map[string]string{"pool": "pool"},
			Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	settled(t, ns, n, 2*time.Minute)
	created, deleting := seen.counts()
	t.Logf("%d adoption slowed; the set created %d Machines and deleted %d for %d replicas and one orphan", proxy.Struck("slow-adoption"), created-1, deleting, n)
	if proxy.Struck("slow-adoption") != 1 {
		t.Fatal("no adoption was slowed: the test proved nothing")
	}
	if created-1 > n {
		t.Fatalf("the set created %d Machines for %d replicas", created-1, n)
	}
}
