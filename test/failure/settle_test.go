package failure

import (
	"context"
	"maps"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

// rest is how long a settled fleet is watched.
const rest = 60 * time.Second

// machinistResources are the API resources whose writes a settled fleet
// must not make.
var machinistResources = []string{
	"machines", "machines/status", "machinesets", "machinesets/status",
	"machinedeployments", "machinedeployments/status",
}

// A settled fleet of mixed states makes no writes to Machines, MachineSets
// or MachineDeployments, beyond the one Machine that is retrying on its
// backoff. It has its own control plane, because kube-apiserver counts
// requests for the whole server.
func TestSettledFleetWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Drift shown a second after a template changes, not 30 s: the paused
	// deployment's Machines say so before the fleet is at rest.
	e, _, stop, err := testenv.StartWithControllers(manager.Options{MachineWorkers: 4, DriftDelay: time.Second}, testenv.Leases{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	c := e.Client
	ns, err := e.Namespace(ctx, "settled")
	if err != nil {
		t.Fatal(err)
	}
	class(t, c, ns, "small", "inmemory", "")
	class(t, c, ns, "broken", "inmemory", `{"failCreate": "quota exceeded"}`)

	steady := testenv.MachineDeployment(ns, "steady", 3)
	paused := testenv.MachineDeployment(ns, "paused", 2)
	for _, md := range []*machinistv1.MachineDeployment{steady, paused} {
		if err := c.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
	}
	failed := machine(t, c, ns, "failed", "broken")
	waiting := machine(t, c, ns, "waiting", "missing")
	held := machine(t, c, ns, "held", "small")

	phaseOf := func(md *machinistv1.MachineDeployment) machinistv1.RolloutPhase {
		got := &machinistv1.MachineDeployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Phase
	}
	testenv.WaitFor(t, time.Minute, "both deployments Stable", func() bool {
		return phaseOf(steady) == machinistv1.RolloutStable && phaseOf(paused) == machinistv1.RolloutStable
	})
	// Paused with a template change waiting: the rollout must not start.
	if err := c.Get(ctx, client.ObjectKeyFromObject(paused), paused); err != nil {
		t.Fatal(err)
	}
	paused.Spec.Paused = true
	paused.Spec.Template.Spec.Version = "v1.37.3"
	if err := c.Update(ctx, paused); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the paused deployment Paused", func() bool { return phaseOf(paused) == machinistv1.RolloutPaused })
	testenv.WaitFor(t, 30*time.Second, "the paused deployment's Machines Drifted", func() bool {
		var list machinistv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels(paused.Spec.Selector.MatchLabels)); err != nil {
			t.Fatal(err)
		}
		for _, m := range list.Items {
			if !meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionDrifted) {
				return false
			}
		}
		return len(list.Items) == 2
	})
	testenv.WaitFor(t, 30*time.Second, "the failed Machine Failed", func() bool { return get(t, c, failed).Status.Phase == machinistv1.MachineFailed })

	// A drain held by a PodDisruptionBudget: a pod on the held Machine's
	// Node that the budget will not let go.
	testenv.WaitFor(t, 30*time.Second, "the held Machine Running", func() bool { return get(t, c, held).Status.Phase == machinistv1.MachineRunning })
	if err := e.HoldDrains(ctx, ns, "db", get(t, c, held).Status.NodeRef.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, held); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the held Machine's drain blocked", func() bool {
		h := get(t, c, held)
		d := meta.FindStatusCondition(h.Status.Conditions, machinistv1.ConditionDrained)
		return h.Status.Phase == machinistv1.MachineDraining && d != nil && d.Reason == "DisruptionBudget"
	})
	// Let what is still settling (the last status writes of the sets, the
	// Events) end before the measurement starts: writes of several kinds,
	// with nothing to show they are over, so a quiet spell is waited out.
	time.Sleep(5 * time.Second)

	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	versions := func() map[string]string {
		out := map[string]string{}
		lists := map[string]client.ObjectList{
			"Machine": &machinistv1.MachineList{}, "MachineSet": &machinistv1.MachineSetList{},
			"MachineDeployment": &machinistv1.MachineDeploymentList{},
		}
		for kind, list := range lists {
			if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			if err := meta.EachListItem(list, func(o runtime.Object) error {
				obj := o.(client.Object)
				out[kind+"/"+obj.GetName()] = obj.GetResourceVersion()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	waitingWrites := countWrites(t, e, ns, testenv.NewMachineList)
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	rvBefore := versions()
	retriesBefore := get(t, c, waiting).Status.ErrorCount
	// A measurement: what is written at rest over this spell.
	time.Sleep(rest)
	after, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	rvAfter := versions()
	retries := get(t, c, waiting).Status.ErrorCount - retriesBefore

	done, refused := after.Done.Since(before.Done), after.Refused.Since(before.Refused)
	t.Logf("in %s at rest: writes by resource %v; refused %v; the waiting Machine retried %d times", rest, done, refused, retries)
	own := waitingWrites.of(waiting.Name)
	if got := int(done.Sum(machinistResources...)); got != own {
		t.Errorf("%d writes to Machines, MachineSets and MachineDeployments; want only the %d of the Machine on its backoff", got, own)
	}
	if budget := backoffSteps(retriesBefore, rest); own > budget || int32(own) != retries {
		t.Errorf("the Machine waiting for its class was written %d times for %d retries; want one write per retry, at most %d", own, retries, budget)
	}
	// A drain held for long asks a few times a minute, not every DrainPoll.
	if n := refused["pods/eviction"]; n > float64(rest/(4*time.Second)) {
		t.Errorf("%v refused evictions in %s of a held drain; want it to back off", n, rest)
	}
	delete(rvBefore, "Machine/"+waiting.Name)
	delete(rvAfter, "Machine/"+waiting.Name)
	if !maps.Equal(rvBefore, rvAfter) {
		t.Errorf("resourceVersions changed at rest:\nbefore %v\nafter  %v", rvBefore, rvAfter)
	}
	for _, r := range []string{"nodes", "nodes/status", "pods", "pods/status"} {
		if done[r] > 0 {
			t.Errorf("%v writes to %s at rest; only kubelet Lease renewals should be steady", done[r], r)
		}
	}
}

// backoffSteps is the most retries the default backoff can make in d, for a
// Machine that has already retried done times: the one under way, plus
// each later step that fits whole.
func backoffSteps(done int32, d time.Duration) int {
	var b machinecontroller.Backoff
	steps, spent := 1, time.Duration(0)
	for n := done + 1; ; n++ {
		if spent += b.After(n); spent > d {
			return steps
		}
		steps++
	}
}
