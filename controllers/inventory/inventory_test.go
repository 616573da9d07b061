package inventory_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
)

var (
	env   *testenv.Env
	ctrls *testenv.Controllers
)

// grace is the orphans' grace in this package's manager.
const grace = 4 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
		env = e
		var err error
		ctrls, err = e.StartControllers(manager.Options{InventoryPeriod: time.Second, OrphanDeletionGrace: grace},
			testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second})
		if err != nil {
			return nil, err
		}
		return func() { _ = ctrls.Stop() }, nil
	}))
}

// TestAnOrphanIsReportedAtOnceAndDeletedAfterItsGrace: a Machine whose
// finalizer is released by hand leaves its instance behind, as a restore
// of an older snapshot leaves those made since. The instance is reported
// within a pass, on an Event in the Machine's namespace, and deleted after
// the grace; the set's replacement keeps its own.
func TestAnOrphanIsReportedAtOnceAndDeletedAfterItsGrace(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "orphan", testenv.Small)
	if err := env.Client.Create(ctx, testenv.MachineSet(ns, "pool", 2)); err != nil {
		t.Fatal(err)
	}
	machines := running(t, env, ns, 2)
	lost := machines[0]
	// Released by hand: the Machine goes without its instance.
	released := lost.DeepCopy()
	released.Finalizers = nil
	if err := env.Client.Patch(ctx, released, client.MergeFrom(&lost)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &lost); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	gone := time.Now()
	reported := waitEvent(t, env, ns, lost.Name, inventory.ReasonOrphanInstance, 10*time.Second)
	t.Logf("the orphan was reported %s after its Machine went", reported.Sub(gone).Round(100*time.Millisecond))
	// Its Node, which nothing else would delete now, is reported while
	// its instance runs...
	node, err := ctrls.Provider.NodeName(lost.Status.ProviderID)
	if err != nil {
		t.Fatal(err)
	}
	nodeEvent := func(reason string) func() error {
		return func() error {
			if reasons := eventsAbout(t, env, metav1.NamespaceDefault, "Node", node); !slices.Contains(reasons, reason) {
				return fmt.Errorf("Events on Node %s: %v", node, reasons)
			}
			return nil
		}
	}
	testenv.WaitFor(t, 5*time.Second, "its Node reported", nodeEvent(inventory.ReasonStrayNode))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{}); err != nil {
		t.Fatalf("the Node of the running orphan: %v", err)
	}
	deleted := waitEvent(t, env, ns, lost.Name, inventory.ReasonOrphanDeleted, grace+10*time.Second)
	t.Logf("the orphan was deleted %s after it was reported (grace %s)", deleted.Sub(reported).Round(100*time.Millisecond), grace)
	// ... and deleted once it is gone.
	testenv.WaitFor(t, 5*time.Second, "its Node deleted", nodeEvent(inventory.ReasonStrayDeleted))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Node of the deleted orphan: %v, want NotFound", err)
	}
	t.Logf("its Node was deleted %s after the orphan", time.Since(deleted).Round(100*time.Millisecond))
	if exists, err := ctrls.Provider.Exists(ctx, lost.Status.ProviderID); err != nil || exists {
		t.Fatalf("the orphan %s still exists (%v)", lost.Status.ProviderID, err)
	}
	// The set replaced its Machine, and nothing of the others was touched.
	after := running(t, env, ns, 2)
	for _, m := range after {
		if exists, err := ctrls.Provider.Exists(ctx, m.Status.ProviderID); err != nil || !exists {
			t.Errorf("Machine %s's instance is gone (%v)", m.Name, err)
		}
		if reasons := eventReasons(t, env, ns, m.Name); slices.Contains(reasons, inventory.ReasonOrphanInstance) {
			t.Errorf("the instance of Machine %s, which has it, was called an orphan", m.Name)
		}
	}
}

// eventReasons lists the reasons of the Events about Machine name in ns.
func eventReasons(t *testing.T, env *testenv.Env, ns, name string) []string {
	t.Helper()
	return eventsAbout(t, env, ns, "Machine", name)
}

// eventsAbout lists the reasons of the Events about the kind name in ns.
func eventsAbout(t *testing.T, env *testenv.Env, ns, kind, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestAGhostIsReportedAtOnceAndReplacedOnce: an instance deleted behind
// the manager's back (as a restore brings back a Machine whose instance
// was deleted since) is reported on its Machine within a pass, long
// before its Node's Lease could expire, and its set replaces it once; a
// Machine of no set is reported and left for a person.
func TestAGhostIsReportedAtOnceAndReplacedOnce(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "ghost", testenv.Small)
	if err := env.Client.Create(ctx, testenv.MachineSet(ns, "pool", 3)); err != nil {
		t.Fatal(err)
	}
	alone := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alone"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}},
	}
	if err := env.Client.Create(ctx, alone); err != nil {
		t.Fatal(err)
	}
	before := running(t, env, ns, 4)
	var ghost, lone machinistv1.Machine
	for _, m := range before {
		if m.Name == alone.Name {
			lone = m
		} else if ghost.Name == "" {
			ghost = m
		}
	}
	for _, m := range []machinistv1.Machine{ghost, lone} {
		if err := ctrls.Provider.Delete(ctx, m.Status.ProviderID); err != nil {
			t.Fatal(err)
		}
	}
	gone := time.Now()
	// Every Machine ever seen in the namespace, by name, to count the
	// replacements.
	seen := map[string]bool{}
	watch := func() []machinistv1.Machine {
		ms, err := testenv.ListMachines(ctx, env.Client, ns)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			seen[m.Name] = true
		}
		return ms
	}
	reported := waitEvent(t, env, ns, ghost.Name, inventory.ReasonInstanceGone, 5*time.Second)
	t.Logf("the ghost was reported %s after its instance went (its Lease lasts 10 s)", reported.Sub(gone).Round(100*time.Millisecond))
	waitEvent(t, env, ns, lone.Name, inventory.ReasonInstanceGone, 5*time.Second)
	testenv.WaitFor(t, time.Minute, "the ghost replaced", func() error {
		ms := watch()
		if slices.ContainsFunc(ms, func(m machinistv1.Machine) bool { return m.UID == ghost.UID }) {
			return fmt.Errorf("ghost %s is still there", ghost.Name)
		}
		if up := slices.DeleteFunc(ms, func(m machinistv1.Machine) bool { return m.Status.Phase != machinistv1.MachineRunning }); len(up) != 4 {
			return fmt.Errorf("%d Machines Running, want 4", len(up))
		}
		return nil
	})
	t.Logf("the ghost was replaced by a Running Machine %s after its instance went", time.Since(gone).Round(100*time.Millisecond))
	// Three more passes change nothing: no second replacement, and the
	// lone ghost is still there, still a ghost.
	for end := time.Now().Add(3500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		watch()
	}
	if len(seen) != 5 {
		t.Errorf("Machines seen: %v, want the 4 first and one replacement", slices.Sorted(maps.Keys(seen)))
	}
	if n := count(eventReasons(t, env, ns, ghost.Name), inventory.ReasonGhostReplaced); n != 1 {
		t.Errorf("%d %s Events on the ghost, want 1", n, inventory.ReasonGhostReplaced)
	}
	after := &machinistv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&lone), after); err != nil || !after.DeletionTimestamp.IsZero() {
		t.Errorf("the Machine of no set was deleted (%v): nothing would replace it", err)
	}
	if reasons := eventReasons(t, env, ns, lone.Name); slices.Contains(reasons, inventory.ReasonGhostReplaced) {
		t.Errorf("the Machine of no set was replaced: %v", reasons)
	}
	listed, err := providers.List(ctx, ctrls.Provider)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(slices.DeleteFunc(listed, func(l providers.Listed) bool { return l.Owner.Namespace != ns })); n != 3 {
		t.Errorf("the provider holds %d instances for namespace %s, want 3, the set's", n, ns)
	}
}

// TestGhostsAreNotReplacedWhenMostOfASetIsGone: 3 of a set's 4 instances
// gone at once is what a provider that lost its books looks like, not a
// restore; replacing them could run each machine twice. They are
// reported, the set is told why they are not replaced, and none is
// deleted.
func TestGhostsAreNotReplacedWhenMostOfASetIsGone(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "ghosts", testenv.Small)
	if err := env.Client.Create(ctx, testenv.MachineSet(ns, "pool", 4)); err != nil {
		t.Fatal(err)
	}
	ms := running(t, env, ns, 4)
	for _, m := range ms[:3] {
		if err := ctrls.Provider.Delete(ctx, m.Status.ProviderID); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the set told its ghosts are not replaced", func() error {
		if reasons := eventsAbout(t, env, ns, "MachineSet", "pool"); !slices.Contains(reasons, inventory.ReasonGhostsHeld) {
			return fmt.Errorf("Events on the set: %v", reasons)
		}
		return nil
	})
	for _, m := range ms[:3] {
		waitEvent(t, env, ns, m.Name, inventory.ReasonInstanceGone, 5*time.Second)
	}
	time.Sleep(3 * time.Second) // three more passes
	for _, m := range running(t, env, ns, 4) {
		if !slices.ContainsFunc(ms, func(o machinistv1.Machine) bool { return o.UID == m.UID }) {
			t.Errorf("Machine %s is new: a ghost was replaced", m.Name)
		}
		if reasons := eventReasons(t, env, ns, m.Name); slices.Contains(reasons, inventory.ReasonGhostReplaced) {
			t.Errorf("Machine %s was replaced: %v", m.Name, reasons)
		}
	}
}

func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

func running(t *testing.T, env *testenv.Env, ns string, n int) []machinistv1.Machine {
	t.Helper()
	var ms []machinistv1.Machine
	testenv.WaitFor(t, time.Minute, fmt.Sprintf("%d Machines Running in %s", n, ns), func() error {
		var err error
		if ms, err = testenv.ListMachines(context.Background(), env.Client, ns); err != nil {
			return err
		}
		if len(ms) != n || slices.ContainsFunc(ms, func(m machinistv1.Machine) bool {
			return m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero()
		}) {
			return fmt.Errorf("%d Machines, not all Running", len(ms))
		}
		return nil
	})
	return ms
}

// waitEvent waits for an Event of reason about the Machine name in ns and
// returns when it was seen.
func waitEvent(t *testing.T, env *testenv.Env, ns, name, reason string, within time.Duration) time.Time {
	t.Helper()
	testenv.WaitFor(t, within, reason+" on Machine "+name, func() error {
		if reasons := eventReasons(t, env, ns, name); !slices.Contains(reasons, reason) {
			return fmt.Errorf("Events %v", reasons)
		}
		return nil
	})
	return time.Now()
}

// unlistable is a provider whose List fails, as one whose API is down
// does.
type unlistable struct {
	testenv.Provider
	calls atomic.Int32
}

func (u *unlistable) List(context.Context) ([]providers.Listed, error) {
	u.calls.Add(1)
	return nil, errors.New("the provider's API is down")
}

// TestAProviderThatCannotListMakesNoGhost: a provider whose List fails
// says nothing of its instances; its Machines are not called ghosts, and
// none is replaced, even one whose instance is really gone (the next
// List that answers finds it).
func TestAProviderThatCannotListMakesNoGhost(t *testing.T) {
	ctx := context.Background()
	down := &unlistable{Provider: ctrls.Provider}
	if err := ctrls.Register("down", down); err != nil {
		t.Fatal(err)
	}
	ns := env.NewNamespace(t, "unlistable")
	class := &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: testenv.Small.Name}, Spec: machinistv1.MachineClassSpec{Provider: "down"}}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, testenv.MachineSet(ns, "pool", 2)); err != nil {
		t.Fatal(err)
	}
	ms := running(t, env, ns, 2)
	if err := ctrls.Provider.Delete(ctx, ms[0].Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	listed := down.calls.Load()
	time.Sleep(3 * time.Second) // three passes
	if down.calls.Load() < listed+2 {
		t.Fatalf("the provider was listed %d times in 3 s, want a pass a second", down.calls.Load()-listed)
	}
	for _, m := range ms {
		if reasons := eventReasons(t, env, ns, m.Name); slices.Contains(reasons, inventory.ReasonInstanceGone) || slices.Contains(reasons, inventory.ReasonGhostReplaced) {
			t.Errorf("Machine %s was judged on a List that failed: %v", m.Name, reasons)
		}
	}
	if now, err := testenv.ListMachines(ctx, env.Client, ns); err != nil || len(now) != 2 || !slices.ContainsFunc(now, func(m machinistv1.Machine) bool { return m.UID == ms[0].UID }) {
		t.Errorf("the Machines changed (%v): a ghost was replaced on a List that failed", err)
	}
}
