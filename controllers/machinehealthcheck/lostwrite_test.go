package machinehealthcheck_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/providers"
)

// A Machine controller that called the provider but could not store what
// it did (its status write lost a conflict, as it can to a health check
// writing the same Machine) sees the new boot already on its next look.
// The boot ID recorded with the operation, not the one it observes then,
// says the reboot is done: the Machine must not wait for a second reboot
// that never comes and be Failed at the timeout.
//
// It lives here because this package's suite can pause the controllers.
// Not parallel: pausing stops every controller.
func TestRebootDoneBeforeItWasStoredIsNotAwaitedAgain(t *testing.T) {
	ctx := context.Background()
	ns := setup(t, "lostwrite", "")
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	oldBoot := m.Status.BootID
	var opID string
	err := controllers.Paused(func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&m), &m); err != nil {
			return err
		}
		op, err := operation.Request(&m, machinistv1.OperationReboot,
			&machinistv1.OperationOptions{SkipDrain: ptr.To(true), TimeoutSeconds: ptr.To(int64(20))},
			machinistv1.SourceAPI, "alice", time.Now())
		if err != nil {
			return err
		}
		opID = op.ID
		if err := env.Client.Status().Update(ctx, &m); err != nil {
			return err
		}
		// What the lost reconcile did before its write failed.
		if err := controllers.Provider.Reboot(ctx, m.Status.ProviderID, providers.Operation{ID: op.ID}); err != nil {
			return err
		}
		testenv.WaitFor(t, wait, "the Node back with a new boot ID", func() bool {
			var node corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, &node); err != nil {
				return false
			}
			return node.Status.NodeInfo.BootID != oldBoot
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Within seconds: the controller looks at the Node as soon as it
	// starts, not at the operation's 20 s deadline or a Lease recheck.
	testenv.WaitFor(t, 5*time.Second, "the reboot, done before it was stored, to end", func() error {
		get(t, &m)
		op := m.Status.Operation
		if op != nil && op.ID == opID && !operation.InFlight(op) {
			if op.State != machinistv1.OperationSucceeded || m.Status.Phase != machinistv1.MachineRunning {
				t.Fatalf("the reboot ended %s with the Machine %s: %s", op.State, m.Status.Phase, op.Message)
			}
			return nil
		}
		if op == nil {
			return fmt.Errorf("no operation, the Machine %s", m.Status.Phase)
		}
		return fmt.Errorf("still %s with the Machine %s", op.State, m.Status.Phase)
	})
	if restarts, err := controllers.Provider.Restarts(m.Status.ProviderID); err != nil || restarts != 1 {
		t.Errorf("the machine restarted %d times (%v), want once", restarts, err)
	}
}
