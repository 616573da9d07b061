// Package cascade tests what Kubernetes' own controllers do to Machines,
// as in any cluster: the garbage collector follows owner references from a
// MachineDeployment to its MachineSets to their Machines, and the namespace
// controller empties a deleted namespace. Each Machine still goes through
// its lifecycle on the way out: drained, its instance and Node deleted,
// its finalizer removed.
package cascade

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithControllers(m, testenv.Options{ControllerManager: true}, manager.Options{MachineWorkers: 4}, testenv.Leases{},
		func(e *testenv.Env, c *testenv.Controllers) { env, controllers = e, c }))
}

const wait = time.Minute

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := env.Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// machineSet is a MachineSet name whose Machines are labelled and
// selected by pool=pool, not pool=name.
func machineSet(ns, name, pool string, replicas int32) *machinistv1.MachineSet {
	ms := testenv.MachineSet(ns, name, replicas)
	ms.Spec.Selector.MatchLabels = map[string]string{"pool": pool}
	ms.Spec.Template = testenv.Template(pool, testenv.Small.Name, testenv.Version)
	return ms
}

// running waits until ns holds n Machines, all Running, and returns them.
func running(t *testing.T, ns string, n int) []machinistv1.Machine {
	t.Helper()
	var ms []machinistv1.Machine
	testenv.WaitFor(t, wait, "Machines Running", func() bool {
		ms = env.Machines(t, ns)
		if len(ms) != n {
			return false
		}
		for _, m := range ms {
			if m.Status.Phase != machinistv1.MachineRunning {
				return false
			}
		}
		return true
	})
	return ms
}

// instance is what a Machine left behind: its provider's instance and its
// Node.
type instance struct {
	uid        types.UID
	providerID string
	node       string
}

func instances(ms []machinistv1.Machine) []instance {
	var out []instance
	for _, m := range ms {
		out = append(out, instance{uid: m.UID, providerID: m.Status.ProviderID, node: m.Status.NodeRef.Name})
	}
	return out
}

// gone checks that every Machine's instance and Node were deleted: the
// Machine went through its lifecycle, not just out of the API.
func gone(t *testing.T, left []instance) {
	t.Helper()
	ctx := context.Background()
	for _, in := range left {
		if id, err := controllers.Provider.FindByUID(ctx, in.uid); err != nil || id != "" {
			t.Errorf("instance %s outlived its Machine (err %v)", id, err)
		}
		err := env.Client.Get(ctx, client.ObjectKey{Name: in.node}, &corev1.Node{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("Node %s outlived its Machine: %v", in.node, err)
		}
	}
}

func notFound(o client.Object) func() bool {
	return func() bool {
		return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o))
	}
}

func TestDeletingAMachineDeploymentDeletesItsMachines(t *testing.T) {
	t.Parallel()
	ns := env.NewNamespace(t, "md-background", testenv.Small)
	md := testenv.MachineDeployment(ns, "workers", 3)
	if err := env.Client.Create(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	ms := running(t, ns, 3)
	left := instances(ms)
	kubectl(t, "-n", ns, "delete", "machinedeployment", "workers")
	testenv.WaitFor(t, wait, "the MachineSets and Machines deleted by the garbage collector", func() bool {
		return len(sets(t, ns)) == 0 && len(env.Machines(t, ns)) == 0
	})
	gone(t, left)
	// Each went through its lifecycle: drained, then deleted.
	for _, m := range ms {
		drained(t, ns, m.Name)
	}
}

// drained checks that the Machine's Events show it was drained and deleted
// by its controller, not just removed from the API.
func drained(t *testing.T, ns, name string) {
	t.Helper()
	want := []string{"MachineDraining", "MachineDeleting", "MachineDeleted"}
	testenv.WaitFor(t, wait, "the lifecycle Events of "+name, func() bool {
		var list eventsv1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.Regarding.Name == name {
				seen[e.Reason] = true
			}
		}
		for _, r := range want {
			if !seen[r] {
				return false
			}
		}
		return true
	})
}

func sets(t *testing.T, ns string) []machinistv1.MachineSet {
	t.Helper()
	var list machinistv1.MachineSetList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// --cascade=orphan on a MachineDeployment leaves its MachineSets, ownerless,
// and their Machines running as they were.
func TestOrphaningAMachineDeploymentKeepsItsMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "md-orphan", testenv.Small)
	md := testenv.MachineDeployment(ns, "workers", 2)
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	before := running(t, ns, 2)
	kubectl(t, "-n", ns, "delete", "machinedeployment", "workers", "--cascade=orphan")
	testenv.WaitFor(t, wait, "the MachineDeployment gone", notFound(md))
	testenv.WaitFor(t, wait, "its MachineSet orphaned", func() bool {
		s := sets(t, ns)
		return len(s) == 1 && metav1.GetControllerOf(&s[0]) == nil
	})
	set := sets(t, ns)[0]
	after := running(t, ns, 2)
	for i := range before {
		if ref := metav1.GetControllerOf(&after[i]); before[i].UID != after[i].UID || ref == nil || ref.UID != set.UID {
			t.Fatalf("Machine %s: want it kept and still owned by MachineSet %s", before[i].Name, set.Name)
		}
	}
}

// With foreground propagation the MachineDeployment is the last to go: it
// stays, marked for deletion, until its Machines are gone.
func TestForegroundDeletionWaitsForTheMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "md-foreground", testenv.Small)
	md := testenv.MachineDeployment(ns, "workers", 2)
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	left := instances(running(t, ns, 2))
	// A pre-drain hook holds one Machine, so the deployment can be seen
	// waiting for it.
	held := env.Machines(t, ns)[0]
	held.Annotations = map[string]string{machinistv1.PreDrainHookPrefix + "test": "hold"}
	if err := env.Client.Update(ctx, &held); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", ns, "delete", "machinedeployment", "workers", "--cascade=foreground", "--wait=false")
	testenv.WaitFor(t, wait, "the held Machine marked for deletion", func() bool {
		m := &machinistv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&held), m); err != nil {
			t.Fatal(err)
		}
		return !m.DeletionTimestamp.IsZero()
	})
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		t.Fatalf("the MachineDeployment went before its Machines: %v", err)
	}
	if md.DeletionTimestamp.IsZero() || !strings.Contains(strings.Join(md.Finalizers, ","), metav1.FinalizerDeleteDependents) {
		t.Fatalf("MachineDeployment: deletionTimestamp %v, finalizers %v; want it waiting for its dependents", md.DeletionTimestamp, md.Finalizers)
	}
	// Release the hook: everything goes, the deployment last.
	m := &machinistv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&held), m); err != nil {
		t.Fatal(err)
	}
	m.Annotations = nil
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the MachineDeployment gone", notFound(md))
	if n := len(env.Machines(t, ns)); n != 0 {
		t.Fatalf("%d Machines left after their MachineDeployment", n)
	}
	gone(t, left)
}

// --cascade=orphan leaves the Machines running and ownerless; a new
// MachineSet with a matching selector adopts them and makes none anew.
func TestOrphanedMachinesAreAdopted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "ms-orphan", testenv.Small)
	old := machineSet(ns, "old", "blue", 2)
	if err := env.Client.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	before := running(t, ns, 2)
	kubectl(t, "-n", ns, "delete", "machineset", "old", "--cascade=orphan")
	testenv.WaitFor(t, wait, "the old MachineSet gone", notFound(old))
	testenv.WaitFor(t, wait, "the Machines orphaned", func() bool {
		for _, m := range env.Machines(t, ns) {
			if metav1.GetControllerOf(&m) != nil {
				return false
			}
		}
		return true
	})
	adopter := machineSet(ns, "new", "blue", 2)
	if err := env.Client.Create(ctx, adopter); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the Machines adopted", func() bool {
		for _, m := range env.Machines(t, ns) {
			if ref := metav1.GetControllerOf(&m); ref == nil || ref.UID != adopter.UID {
				return false
			}
		}
		return true
	})
	after := running(t, ns, 2)
	for i := range before {
		if before[i].UID != after[i].UID {
			t.Fatalf("the adopting MachineSet replaced Machines: %s became %s", before[i].Name, after[i].Name)
		}
	}

	// And deleting a MachineSet the ordinary way deletes its Machines.
	kubectl(t, "-n", ns, "delete", "machineset", "new")
	testenv.WaitFor(t, wait, "the adopted Machines deleted", func() bool { return len(env.Machines(t, ns)) == 0 })
	gone(t, instances(after))
}

// A deleted namespace empties: every Machine in it goes through deletion,
// and the namespace disappears.
func TestDeletingANamespaceDeletesItsMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "namespace", testenv.Small)
	if err := env.Client.Create(ctx, machineSet(ns, "pool", "pool", 2)); err != nil {
		t.Fatal(err)
	}
	left := instances(running(t, ns, 2))
	kubectl(t, "delete", "namespace", ns, "--wait=false")
	testenv.WaitFor(t, wait, "the namespace gone", notFound(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	gone(t, left)
}
