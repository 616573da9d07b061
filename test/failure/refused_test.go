package failure

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

// A rolling upgrade is refused (almost) no write: the controllers act on
// nothing their cache holds older than their own last write. Before that,
// a Machine whose finalizer was just removed was deleted again from the
// cache's stale copy (each write refused NotFound), and a set's status
// update was refused (Conflict) whenever its MachineDeployment had resized
// it since the read: together about 1.4 refused writes per replaced
// Machine. The bound is 0.1 per replaced Machine. It has its own control
// plane, because kube-apiserver counts requests for the whole server.
func TestARollingUpgradeIsRefusedAlmostNoWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 40
	// Drift is shown long after the rollout: its condition writes on old
	// Machines are not what this test measures.
	e, _, stop, err := testenv.StartWithControllers(manager.Options{MachineWorkers: 8, DriftDelay: time.Hour}, testenv.Leases{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	c := e.Client
	ns, err := e.Namespace(ctx, "refused")
	if err != nil {
		t.Fatal(err)
	}
	class(t, c, ns, "small", "inmemory", "")
	md := testenv.MachineDeployment(ns, "pool", n)
	md.Spec.Template.Spec.Version = "v1.37.1"
	// Five at a time: many resizes of both sets, as in a large rollout.
	surge, unavailable := intstr.FromInt32(5), intstr.FromInt32(0)
	md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable}}
	if err := c.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	atVersion := func(version string) func() bool {
		return func() bool {
			var list machinistv1.MachineList
			if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) != n {
				return false
			}
			for _, m := range list.Items {
				if m.Spec.Version != version || m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero() {
					return false
				}
			}
			return true
		}
	}
	testenv.WaitFor(t, 2*time.Minute, "the first version running", atVersion("v1.37.1"))

	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`))
	if err := c.Patch(ctx, md, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every Machine replaced", atVersion("v1.37.2"))
	// The last deletions' trailing writes: nothing shows when they are
	// over, so a quiet spell of two seconds is waited out.
	time.Sleep(2 * time.Second)
	after, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	refused := after.Refused.Since(before.Refused)
	total := refused.Sum(append(machinistResources, "nodes")...)
	if total > 0.1*n {
		t.Fatalf("%v writes refused while replacing %d Machines, more than 0.1 each: %v", total, n, refused)
	}
	t.Logf("replacing %d Machines: %v refused writes %v; done %v", n, total, refused, after.Done.Since(before.Done))
}
