package inventory_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
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
	machines := running(t, ns, 2)
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
	reported := waitEvent(t, ns, lost.Name, inventory.ReasonOrphanInstance, 10*time.Second)
	t.Logf("the orphan was reported %s after its Machine went", reported.Sub(gone).Round(100*time.Millisecond))
	deleted := waitEvent(t, ns, lost.Name, inventory.ReasonOrphanDeleted, grace+10*time.Second)
	t.Logf("the orphan was deleted %s after it was reported (grace %s)", deleted.Sub(reported).Round(100*time.Millisecond), grace)
	if exists, err := ctrls.Provider.Exists(ctx, lost.Status.ProviderID); err != nil || exists {
		t.Fatalf("the orphan %s still exists (%v)", lost.Status.ProviderID, err)
	}
	// The set replaced its Machine, and nothing of the others was touched.
	after := running(t, ns, 2)
	for _, m := range after {
		if exists, err := ctrls.Provider.Exists(ctx, m.Status.ProviderID); err != nil || !exists {
			t.Errorf("Machine %s's instance is gone (%v)", m.Name, err)
		}
		if reasons := eventReasons(t, ns, m.Name); slices.Contains(reasons, inventory.ReasonOrphanInstance) {
			t.Errorf("the instance of Machine %s, which has it, was called an orphan", m.Name)
		}
	}
}

// eventReasons lists the reasons of the Events about Machine name in ns.
func eventReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Machine" && e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestAGhostIsReportedWithoutWaitingForItsLease: an instance deleted
// behind the manager's back (as a restore brings back a Machine whose
// instance was deleted since) is reported on its Machine within a pass,
// long before its Node's Lease could expire.
func TestAGhostIsReportedWithoutWaitingForItsLease(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "ghost", testenv.Small)
	if err := env.Client.Create(ctx, testenv.MachineSet(ns, "pool", 1)); err != nil {
		t.Fatal(err)
	}
	m := running(t, ns, 1)[0]
	if err := ctrls.Provider.Delete(ctx, m.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	seen := waitEvent(t, ns, m.Name, inventory.ReasonInstanceGone, 5*time.Second)
	t.Logf("the ghost was reported %s after its instance went (its Lease lasts 10 s)", seen.Sub(gone).Round(100*time.Millisecond))
}

func running(t *testing.T, ns string, n int) []machinistv1.Machine {
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
func waitEvent(t *testing.T, ns, name, reason string, within time.Duration) time.Time {
	t.Helper()
	testenv.WaitFor(t, within, reason+" on Machine "+name, func() error {
		if reasons := eventReasons(t, ns, name); !slices.Contains(reasons, reason) {
			return fmt.Errorf("Events %v", reasons)
		}
		return nil
	})
	return time.Now()
}
