package inventory_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// TestAnEtcdRestoredToAnOlderSnapshotLosesLeaksAndRepeatsNothing: the
// management cluster's etcd is snapshotted with etcdctl while a Machine's
// reboot is in flight, then the fleet moves on: the reboot finishes, the
// set scales up by 3 and down by 2 (two Machines of the snapshot go).
// The cluster is then stopped, the snapshot restored with etcdutl, and
// started again with a new manager, as an operator restores one. After
// it:
//   - the 3 instances made since are orphans: reported at once, deleted
//     after the grace;
//   - the 2 Machines deleted since are back, as ghosts: each is replaced
//     once;
//   - the reboot, in flight again in the restored status, is not done a
//     second time (the provider knows its operation ID);
//   - the fleet ends at its 3 replicas, on 3 instances, each with its
//     Node and no other Node left.
func TestAnEtcdRestoredToAnOlderSnapshotLosesLeaksAndRepeatsNothing(t *testing.T) {
	ctx := context.Background()
	e, c, stop, err := testenv.StartWithControllers(manager.Options{InventoryPeriod: time.Second, OrphanDeletionGrace: grace},
		testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	ns := e.NewNamespace(t, "snapshot", testenv.Small)
	// Reboots slow enough to be caught in flight by the snapshot (a
	// machine takes its faults when it is made).
	c.Provider.SetFaults(inmemory.ProviderSpec{RebootLatency: metav1.Duration{Duration: 3 * time.Second}})
	set := testenv.MachineSet(ns, "pool", 3)
	if err := e.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	first := running(t, e, ns, 3)
	kept, goneA, goneB := first[0], first[1], first[2]

	bootsBefore, err := c.Provider.Restarts(kept.Status.ProviderID)
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, e, &kept, machinistv1.RequestAnnotation, "reboot")
	var op string
	testenv.WaitFor(t, 30*time.Second, "the reboot in flight", func() error {
		m := &machinistv1.Machine{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(&kept), m); err != nil {
			return err
		}
		if m.Status.Phase != machinistv1.MachineRebooting || m.Status.Operation == nil {
			return fmt.Errorf("phase %s, operation %+v, annotations %v", m.Status.Phase, m.Status.Operation, m.Annotations)
		}
		op = m.Status.Operation.ID
		return nil
	})
	snapshot := filepath.Join(t.TempDir(), "snapshot.db")
	if err := e.SnapshotEtcd(ctx, snapshot); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot taken with reboot %s of %s in flight", op, kept.Name)

	// The fleet moves on.
	testenv.WaitFor(t, 30*time.Second, "the reboot done", func() error {
		m := &machinistv1.Machine{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(&kept), m); err != nil {
			return err
		}
		if m.Status.Phase != machinistv1.MachineRunning || m.Status.Operation == nil || m.Status.Operation.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("phase %s, operation %+v", m.Status.Phase, m.Status.Operation)
		}
		return nil
	})
	boots, err := c.Provider.Restarts(kept.Status.ProviderID)
	if err != nil {
		t.Fatal(err)
	}
	if boots != bootsBefore+1 {
		t.Fatalf("%s restarted %d times for its reboot, want once", kept.Name, boots-bootsBefore)
	}
	scale(t, e, ns, set.Name, 6)
	six := running(t, e, ns, 6)
	var newer []machinistv1.Machine
	for _, m := range six {
		if !slices.ContainsFunc(first, func(f machinistv1.Machine) bool { return f.UID == m.UID }) {
			newer = append(newer, m)
		}
	}
	annotate(t, e, &goneA, machinistv1.DeleteMachineAnnotation, "true")
	annotate(t, e, &goneB, machinistv1.DeleteMachineAnnotation, "true")
	scale(t, e, ns, set.Name, 4)
	four := running(t, e, ns, 4)
	if slices.ContainsFunc(four, func(m machinistv1.Machine) bool { return m.UID == goneA.UID || m.UID == goneB.UID }) {
		t.Fatalf("the scale-down kept a Machine marked for deletion")
	}
	if held := instances(t, c.Provider, ns); len(held) != 4 {
		t.Fatalf("the provider holds %d instances in %s before the restore, want 4", len(held), ns)
	}

	// The restore, the manager stopped meanwhile as the cluster's own
	// pods are.
	restoring := time.Now()
	if err := c.Paused(func() error { return e.RestoreEtcd(ctx, snapshot) }); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	t.Logf("etcd restored and kube-apiserver ready again in %s", restored.Sub(restoring).Round(100*time.Millisecond))
	// Every Machine there from now on, by name, to count the
	// replacements.
	var mu sync.Mutex
	seen := map[string]bool{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events, err := e.WatchMachines(watchCtx, ns)
	if err != nil {
		t.Fatal(err)
	}
	now, err := testenv.ListMachines(ctx, e.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range now {
		seen[m.Name] = true
	}
	go func() {
		for ev := range events {
			if m, ok := ev.Object.(*machinistv1.Machine); ok {
				mu.Lock()
				seen[m.Name] = true
				mu.Unlock()
			}
		}
	}()
	back := &machinistv1.MachineSet{}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(set), back); err != nil || *back.Spec.Replicas != 3 {
		t.Fatalf("the restored set: %v, replicas %v, want the snapshot's 3", err, back.Spec.Replicas)
	}

	for _, m := range newer {
		waitEvent(t, e, ns, m.Name, inventory.ReasonOrphanInstance, 10*time.Second)
	}
	t.Logf("the 3 instances made since the snapshot were reported as orphans %s after the restore", time.Since(restored).Round(100*time.Millisecond))
	for _, m := range []machinistv1.Machine{goneA, goneB} {
		waitEvent(t, e, ns, m.Name, inventory.ReasonGhostReplaced, 30*time.Second)
	}
	t.Logf("the 2 Machines deleted since the snapshot were replaced as ghosts %s after the restore", time.Since(restored).Round(100*time.Millisecond))
	for _, m := range newer {
		waitEvent(t, e, ns, m.Name, inventory.ReasonOrphanDeleted, grace+10*time.Second)
	}
	t.Logf("the orphans were deleted %s after the restore (grace %s)", time.Since(restored).Round(100*time.Millisecond), grace)

	// The fleet settles at its replicas, and stays there.
	var last []machinistv1.Machine
	settled := func() error {
		ms, err := testenv.ListMachines(ctx, e.Client, ns)
		if err != nil {
			return err
		}
		if up := slices.DeleteFunc(slices.Clone(ms), func(m machinistv1.Machine) bool {
			return m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero()
		}); len(up) != 3 || len(ms) != 3 {
			var not []string
			for _, m := range ms {
				if m.Status.Phase != machinistv1.MachineRunning {
					not = append(not, fmt.Sprintf("%s %s %+v %+v", m.Name, m.Status.Phase, m.Status.Operation, m.Status.Conditions))
				}
			}
			return fmt.Errorf("%d Machines, %d Running, want 3: %v", len(ms), len(up), not)
		}
		last = ms
		return nil
	}
	testenv.WaitFor(t, time.Minute, "3 Machines Running", settled)
	t.Logf("the fleet was back at its 3 replicas %s after the restore", time.Since(restored).Round(100*time.Millisecond))
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err := settled(); err != nil {
			t.Fatalf("the fleet moved after it settled: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 5 {
		t.Errorf("Machines seen after the restore: %v, want the snapshot's 3 and 2 replacements", slices.Sorted(maps.Keys(seen)))
	}
	if !slices.ContainsFunc(last, func(m machinistv1.Machine) bool { return m.UID == kept.UID }) {
		t.Errorf("%s, whose instance was never lost, was replaced", kept.Name)
	}
	for _, m := range []machinistv1.Machine{goneA, goneB} {
		if n := count(eventReasons(t, e, ns, m.Name), inventory.ReasonGhostReplaced); n != 1 {
			t.Errorf("%d %s Events on %s, want 1", n, inventory.ReasonGhostReplaced, m.Name)
		}
	}

	// The reboot was not done again.
	again := &machinistv1.Machine{}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(&kept), again); err != nil {
		t.Fatal(err)
	}
	if again.Status.Operation == nil || again.Status.Operation.ID != op || again.Status.Operation.State != machinistv1.OperationSucceeded {
		t.Errorf("%s's operation after the restore: %+v, want %s Succeeded", kept.Name, again.Status.Operation, op)
	}
	if n, err := c.Provider.Restarts(kept.Status.ProviderID); err != nil || n != boots {
		t.Errorf("%s restarted %d times in all (%v), want %d: its reboot was done again", kept.Name, n-bootsBefore, err, boots-bootsBefore)
	}

	// Nothing leaked: an instance for each Machine, a Node for each, and
	// no other Node.
	held := instances(t, c.Provider, ns)
	want := map[string]bool{}
	for _, m := range last {
		want[m.Status.ProviderID] = true
		if _, ok := held[m.Status.ProviderID]; !ok {
			t.Errorf("%s's instance %s is not held", m.Name, m.Status.ProviderID)
		}
	}
	if len(held) != 3 {
		t.Errorf("the provider holds %d instances in %s, want 3: %v", len(held), ns, slices.Sorted(maps.Keys(held)))
	}
	testenv.WaitFor(t, 30*time.Second, "a Node for each Machine and no other", func() error {
		var nodes corev1.NodeList
		if err := e.Client.List(ctx, &nodes); err != nil {
			return err
		}
		var ids []string
		for _, n := range nodes.Items {
			ids = append(ids, n.Spec.ProviderID)
		}
		if len(ids) != 3 || slices.ContainsFunc(ids, func(id string) bool { return !want[id] }) {
			return fmt.Errorf("Nodes of %v, want those of %v", ids, slices.Sorted(maps.Keys(want)))
		}
		return nil
	})
}

// annotate sets the annotation key=value on m.
func annotate(t *testing.T, e *testenv.Env, m *machinistv1.Machine, key, value string) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, key, value))
	obj := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name}}
	if err := e.Client.Patch(context.Background(), obj, patch); err != nil {
		t.Fatal(err)
	}
}

// scale sets the replicas of MachineSet name in ns.
func scale(t *testing.T, e *testenv.Env, ns, name string, n int32) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))
	obj := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := e.Client.Patch(context.Background(), obj, patch); err != nil {
		t.Fatal(err)
	}
}
