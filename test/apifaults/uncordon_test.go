package apifaults

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
)

// uncordonRefused brings a Machine to Draining for a reboot with opts,
// its Node cordoned and its drain held by a pod no eviction may take, then
// arms the proxy to refuse (503) the next two patches of the Node: the
// uncordon that ends the operation, whichever way it ends. It returns the
// Machine and its Node's name.
func uncordonRefused(t *testing.T, seed uint64, opts *machinistv1.OperationOptions) (*machinistv1.Machine, string) {
	t.Helper()
	start(t, seed)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m := running(t, ns, "m1")
	nodeName := m.Status.NodeRef.Name
	if err := env.HoldDrains(ctx, ns, "held", nodeName); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if _, err := operation.Request(m, machinistv1.OperationReboot, opts, machinistv1.SourceAPI, "test", time.Now()); err != nil {
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
	arm(t, seed, faults.Rule{Name: "refused-uncordon", Fault: faults.Unavailable, Verbs: []string{"patch"},
		Resources: []string{"nodes"}, Names: []string{nodeName}, Rate: 1, Limit: 2})
	return m, nodeName
}

// runningOnASchedulableNode waits until m is Running with its operation
// ended in state, then fails t if the uncordon was never refused (the test
// proved nothing) or if the Node is still cordoned.
func runningOnASchedulableNode(t *testing.T, m *machinistv1.Machine, nodeName string, state machinistv1.OperationState) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, 2*time.Minute, "the operation to end "+string(state)+" with the Machine Running", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if op := m.Status.Operation; m.Status.Phase != machinistv1.MachineRunning || op == nil || op.State != state {
			return fmt.Errorf("the Machine is %s, its operation %+v", m.Status.Phase, op)
		}
		return nil
	})
	node := &corev1.Node{}
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

// An uncordon that kube-apiserver refuses at the end of a reboot must be
// tried again: the Machine stays Rebooting until its Node is schedulable,
// and never runs on a Node left cordoned, which no later look would undo
// (a Running Machine's Node is only uncordoned by the operation that
// cordoned it). Before, the Machine moved to Running in the same write as
// the failed uncordon, and its Node stayed cordoned for good.
func TestARefusedUncordonAfterARebootIsTriedAgain(t *testing.T) {
	m, nodeName := uncordonRefused(t, 41, nil)
	if err := env.AllowDisruptions(context.Background(), m.Namespace, "held", 1); err != nil {
		t.Fatal(err)
	}
	runningOnASchedulableNode(t, m, nodeName, machinistv1.OperationSucceeded)
}

// The same for an operation given up while draining (its timeoutSeconds
// passed with the drain still held): the abort's uncordon, refused, is
// tried again before the Machine returns to service.
func TestARefusedUncordonOfAnAbortIsTriedAgain(t *testing.T) {
	m, nodeName := uncordonRefused(t, 43, &machinistv1.OperationOptions{TimeoutSeconds: ptr.To(int64(3))})
	runningOnASchedulableNode(t, m, nodeName, machinistv1.OperationFailed)
}
