package apifaults

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// An in-place rollout hands each updated Machine from the old set to the
// new one: first both sets list it (the old one lowering its replicas,
// the new one raising them), then the Machine changes owner. A set reads
// itself and its Machines from two watches, which need not deliver in the
// order written; here the sets' watch runs seconds behind the Machines'.
// The old set must not see a Machine leave before the list that lowered
// its replicas, count itself short and create a Machine.
func TestAnInPlaceHandOverSeenOutOfOrderCreatesNothing(t *testing.T) {
	const n = 4
	start(t, 43, faults.Rule{Name: "lagging-sets", Fault: faults.Latency, Verbs: []string{"watch"}, Resources: []string{"machinesets"},
		Rate: 1, Delay: metav1.Duration{Duration: 2 * time.Second}})
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	seen := watchMachines(t, ns)
	md := deployment(ns, n, machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy, InPlace: &machinistv1.InPlaceUpdate{
		MaxUnavailable: ptr.To(intstr.FromInt32(2))}}, "v1.37.1")
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	settled(t, ns, n, 2*time.Minute)
	p := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`))
	if err := env.Client.Patch(ctx, md, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "every Machine updated in place and handed over", func() bool {
		var sets machinistv1.MachineSetList
		if err := env.Client.List(ctx, &sets, client.InNamespace(ns)); err != nil {
			return false
		}
		newest := map[types.UID]bool{}
		for _, ms := range sets.Items {
			if ms.Spec.Template.Spec.Version == "v1.37.2" {
				newest[ms.UID] = true
			}
		}
		ms := live(t, ns)
		if len(ms) != n {
			return false
		}
		for _, m := range ms {
			ref := metav1.GetControllerOf(&m)
			if ref == nil || !newest[ref.UID] || m.Status.NodeInfo == nil || m.Status.NodeInfo.KubeletVersion != "v1.37.2" {
				return false
			}
		}
		return true
	})
	// Nothing is to happen now: long enough for a set that had counted
	// itself short to show it.
	time.Sleep(3 * time.Second)
	settled(t, ns, n, time.Minute)
	if created, deleting := seen.counts(); created != n || deleting != 0 {
		t.Fatalf("the rollout created %d Machines and deleted %d for %d updated in place", created, deleting, n)
	}
}
