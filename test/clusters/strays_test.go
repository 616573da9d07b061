package clusters

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestANodeWithoutMachineIsReportedOnItsWorkloadCluster: a Machine lost
// from the management cluster (its finalizer released, as an older
// snapshot or a hand may lose it) leaves its instance running and its Node
// in the workload cluster. The Node is reported on the WorkloadCluster of
// the Machine's namespace, and not on another namespace's WorkloadCluster
// of the same cluster, whose tenant has no business knowing of it; it is
// deleted once its instance is gone, and not before.
func TestANodeWithoutMachineIsReportedOnItsWorkloadCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "stray", testenv.Small)
	serve(t, ns)
	// Another tenant's WorkloadCluster of the same cluster, connected
	// since a Machine of its own runs there.
	other := env.NewNamespace(t, "stray-other", testenv.Small)
	register(t, workloads[blue], other, blue)
	runPool(t, other, "neighbour", blue, 1)

	lost := runPool(t, ns, "lost", blue, 1)[0]
	id := lost.Status.ProviderID
	node := nodeOf(t, blue, id)
	if node == nil {
		t.Fatalf("Machine %s has no Node in %s", lost.Name, blue)
	}
	// Its set paused, so that it makes no other; the Machine paused, so
	// that nothing puts its finalizer back, then deleted with it released.
	set := &machinistv1.MachineSet{}
	set.Namespace, set.Name = ns, "lost"
	paused := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+machinistv1.PausedAnnotation+`":"test"}}}`))
	if err := env.Client.Patch(ctx, set, paused); err != nil {
		t.Fatal(err)
	}
	pause(t, &lost, true)
	if err := env.Client.Patch(ctx, &lost, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &lost); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()

	// Reported within a pass of the inventory, on blue's WorkloadCluster
	// of ns alone.
	reported := waitStrayEvent(t, ns, inventory.ReasonStrayNode, node.Name, inventory.DefaultPeriod+30*time.Second)
	t.Logf("Node %s reported %s after its Machine went: %s", node.Name, time.Since(gone).Round(100*time.Millisecond), reported)
	if n := nodeOf(t, blue, id); n == nil {
		t.Fatal("the Node of a running instance was deleted")
	}

	// Once its instance is gone, the Node goes.
	if err := ctrls.Provider.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitStrayEvent(t, ns, inventory.ReasonStrayDeleted, node.Name, inventory.DefaultPeriod+30*time.Second)
	testenv.WaitFor(t, 10*time.Second, "the Node deleted", func() error {
		if nodeOf(t, blue, id) != nil {
			return errNotYet("still there")
		}
		return nil
	})
	t.Logf("Node %s deleted %s after its instance", node.Name, time.Since(deleted).Round(100*time.Millisecond))
	// Two passes have looked at every WorkloadCluster since the Node had
	// no Machine, and their Events, sent behind them, have arrived in ns.
	for _, reason := range []string{inventory.ReasonStrayNode, inventory.ReasonStrayDeleted} {
		if said := strayEvents(t, other, reason, node.Name); len(said) > 0 {
			t.Errorf("namespace %s was told of another namespace's Node: %v", other, said)
		}
	}
}

// strayEvents returns the messages of the Events of reason about blue's
// WorkloadCluster in ns that name node.
func strayEvents(t *testing.T, ns, reason, node string) []string {
	t.Helper()
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "WorkloadCluster" && e.InvolvedObject.Name == blue && e.Reason == reason && strings.Contains(e.Message, node) {
			out = append(out, e.Message)
		}
	}
	return out
}

// waitStrayEvent waits for one such Event, and returns its message.
func waitStrayEvent(t *testing.T, ns, reason, node string, timeout time.Duration) string {
	t.Helper()
	var said []string
	testenv.WaitFor(t, timeout, fmt.Sprintf("Event %s about Node %s in %s", reason, node, ns), func() error {
		if said = strayEvents(t, ns, reason, node); len(said) == 0 {
			return errNotYet("none")
		}
		return nil
	})
	return said[0]
}
