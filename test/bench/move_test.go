package bench

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// BenchmarkMove times `machinist move` of a namespace holding a
// MachineSet of moveMachines Machines, each with the status of a Running
// inmemory Machine, from one management cluster to another. No manager
// runs on either: a move's work is requests to the two kube-apiservers
// (a pause, a create, a status write and a deletion per object, and the
// finalizer's release), whatever the instances behind them do, which a
// move never touches (TestMoveToAnotherManagementCluster checks that).
func BenchmarkMove(b *testing.B) {
	const moveMachines = 1000
	ctx := context.Background()
	bin, err := testenv.Machinist()
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		from := freshEnv(b, testenv.Options{})
		to := freshEnv(b, testenv.Options{})
		ns := "fleet"
		if _, err := from.Kubectl(ctx, "create", "namespace", ns); err != nil {
			b.Fatal(err)
		}
		if err := from.InmemoryClass(ctx, ns, testenv.Small.Name, ""); err != nil {
			b.Fatal(err)
		}
		set := testenv.MachineSet(ns, "pool", moveMachines)
		if err := from.Client.Create(ctx, set); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, moveMachines)
		sem := make(chan struct{}, 32)
		for i := range moveMachines {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				m := &machinistv1.Machine{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pool-%04d", i), Labels: set.Spec.Template.Metadata.Labels,
						Finalizers:      []string{machinistv1.MachineFinalizer},
						OwnerReferences: []metav1.OwnerReference{{APIVersion: machinistv1.GroupVersion.String(), Kind: "MachineSet", Name: set.Name, UID: set.UID, Controller: ptr.To(true)}}},
					Spec: set.Spec.Template.Spec,
				}
				if err := from.Client.Create(ctx, m); err != nil {
					errs <- err
					return
				}
				m.Status = machinistv1.MachineStatus{Phase: machinistv1.MachineRunning, ProviderID: "inmemory:///" + ns + "/" + m.Name + "/" + string(m.UID), BootID: "boot-1"}
				if err := from.Client.Status().Update(ctx, m); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		start := time.Now()
		out, err := exec.Command(bin, "move", "--kubeconfig", from.Kubeconfig, "--to-kubeconfig", to.Kubeconfig, "-n", ns).CombinedOutput()
		took := time.Since(start)
		if err != nil {
			b.Fatalf("machinist move: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), fmt.Sprintf("moved %d objects", moveMachines+2)) {
			b.Fatalf("machinist move said:\n%s", out[max(0, len(out)-300):])
		}
		moved, err := testenv.ListMachines(ctx, to.Client, ns)
		if err != nil || len(moved) != moveMachines {
			b.Fatalf("%d Machines on the target (%v)", len(moved), err)
		}
		b.ReportMetric(took.Seconds(), "s/move")
		b.ReportMetric(float64(moveMachines)/took.Seconds(), "machines/s")
	}
}
