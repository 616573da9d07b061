package apifaults

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/faults"
	"github.com/machinist-dev/machinist/operation"
	"github.com/machinist-dev/machinist/testenv"
)

// An uncordon that kube-apiserver refuses at the end of a reboot must be
// tried again: the Machine stays Rebooting until its Node is schedulable,
// and never runs on a Node left cordoned, which no later look would undo
// (a Running Machine's Node is only uncordoned by the operation that
// cordoned it). Before, the Machine moved to Running in the same write as
// the failed uncordon, and its Node stayed cordoned for good.
func TestARefusedUncordonAfterARebootIsTriedAgain(t *testing.T) {
	start(t, 41)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m := running(t, ns, "m1")
	nodeName := m.Status.NodeRef.Name
	// A pod no eviction may take keeps the Machine Draining, its Node
	// cordoned, until the fault is armed: the next patch of the Node is
	// then the uncordon.
	if err := env.HoldDrains(ctx, ns, "held", nodeName); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if _, err := operation.Request(m, machinistv1.OperationReboot, nil, machinistv1.SourceAPI, "test", time.Now()); err != nil {
			return err
		}
		return env.Client.Status().Update(ctx, m)
	}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{}
	testenv.WaitFor(t, time.Minute, "the Machine Draining with its Node cordoned", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
			return err
		}
		if m.Status.Phase != machinistv1.MachineDraining || !node.Spec.Unschedulable {
			return fmt.Errorf("the Machine is %s, the Node unschedulable=%v", m.Status.Phase, node.Spec.Unschedulable)
		}
		return nil
	})
	arm(t, 41, faults.Rule{Name: "refused-uncordon", Fault: faults.Unavailable, Verbs: []string{"patch"},
		Resources: []string{"nodes"}, Names: []string{nodeName}, Rate: 1, Limit: 2})
	if err := env.AllowDisruptions(ctx, ns, "held", 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the reboot to succeed", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if op := m.Status.Operation; m.Status.Phase != machinistv1.MachineRunning || op == nil || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("the Machine is %s, its operation %+v", m.Status.Phase, op)
		}
		return nil
	})
	if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		t.Fatal(err)
	}
	struck := proxy.Struck("refused-uncordon")
	t.Logf("%d uncordons refused; the Machine is Running and its Node unschedulable=%v", struck, node.Spec.Unschedulable)
	if struck == 0 {
		t.Fatal("no uncordon was refused: the test proved nothing")
	}
	if node.Spec.Unschedulable {
		t.Fatal("the Machine is Running on a Node left cordoned")
	}
}
