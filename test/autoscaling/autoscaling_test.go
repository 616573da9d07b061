package autoscaling

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes/template"
)

// workers is a MachineDeployment of n that the autoscaler may size
// between 0 and 5.
func workers(t *testing.T, ns, name string, n int32) *machinistv1.MachineDeployment {
	t.Helper()
	md := testenv.MachineDeployment(ns, name, n)
	md.Annotations = map[string]string{minSizeKey: "0", maxSizeKey: "5"}
	if err := env.Client.Create(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	return md
}

// running waits for n Running Machines with a Node in pool, and returns
// them sorted by name.
func running(t *testing.T, ns, pool string, n int) []machinistv1.Machine {
	t.Helper()
	var ms []machinistv1.Machine
	testenv.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d Machines of %s Running", n, pool), func() error {
		all, err := testenv.ListMachines(context.Background(), env.Client, ns, client.MatchingLabels{"pool": pool})
		if err != nil {
			return err
		}
		ms = ms[:0]
		for _, m := range all {
			if m.Status.Phase == machinistv1.MachineRunning && m.Status.NodeRef != nil && m.DeletionTimestamp.IsZero() {
				ms = append(ms, m)
			}
		}
		if len(ms) != n || len(all) != n {
			return fmt.Errorf("%d Running of %d", len(ms), len(all))
		}
		return nil
	})
	return ms
}

func names(ms []machinistv1.Machine) []string {
	out := make([]string, len(ms))
	for i := range ms {
		out[i] = ms[i].Name
	}
	slices.Sort(out)
	return out
}

// TestANodeLeadsToItsMachineAndItsMachineDeployment: from each Node, the
// autoscaler finds the Machine and the MachineDeployment it belongs to,
// and sees the Machine running under the Node's own providerID. A Node
// whose annotation names another Machine is put right.
func TestANodeLeadsToItsMachineAndItsMachineDeployment(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "lookup", testenv.Small)
	md := workers(t, ns, "workers", 2)
	ms := running(t, ns, "workers", 2)

	u, err := r.get("machinedeployments", ns, md.Name)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi, err := bounds(u); err != nil || lo != 0 || hi != 5 {
		t.Fatalf("the group's bounds: %d..%d, %v", lo, hi, err)
	}
	ids := map[string]bool{}
	for _, m := range ms {
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, &node); err != nil {
			t.Fatal(err)
		}
		if got, want := node.Annotations, map[string]string{machineKey: m.Name, namespaceKey: ns}; got[machineKey] != m.Name || got[namespaceKey] != ns {
			t.Fatalf("Node %s is annotated %v, want %v", node.Name, got, want)
		}
		if _, has := node.Annotations[machinistv1.NodeClusterNameAnnotation]; has {
			t.Errorf("Node %s of the management cluster names a cluster: %v", node.Name, node.Annotations)
		}
		kind, name, err := r.groupForNode(&node)
		if err != nil {
			t.Fatal(err)
		}
		if kind != "MachineDeployment" || name != md.Name {
			t.Fatalf("Node %s belongs to %s %s, want MachineDeployment %s", node.Name, kind, name, md.Name)
		}
		ids[node.Spec.ProviderID] = true
	}
	got := r.instances("machinedeployments", ns, md.Name)
	if len(got) != 2 {
		t.Fatalf("instances %+v, want 2", got)
	}
	for _, in := range got {
		if in.state != "running" || in.failed || !ids[in.id] {
			t.Errorf("instance %+v: want running under one of the Nodes' providerIDs %v", in, ids)
		}
	}

	// A kubelet may write its own Node's annotations: one naming another
	// Machine is put back.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ms[0].Status.NodeRef.Name}}
	forged := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, machineKey, ms[1].Name)
	if err := env.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(forged))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the Node's annotation to name its own Machine again", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(node), node) == nil && node.Annotations[machineKey] == ms[0].Name
	})
}

// TestAScaleDownRemovesTheMarkedMachine: the autoscaler's scale-down of
// one Node (the Machine marked, the size lowered through /scale) removes
// that Machine and no other, and creates none, even under a
// MachineDisruptionBudget that allows no disruption: a scale-down is the
// owner's decision on how many Machines there are, as kubectl scale is,
// and the autoscaler has drained the Node through the pods' own budgets
// before it asks.
func TestAScaleDownRemovesTheMarkedMachine(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "down", testenv.Small)
	md := workers(t, ns, "workers", 3)
	before := running(t, ns, "workers", 3)
	if err := env.Client.Create(ctx, testenv.Budget(ns, "none", "workers", 0)); err != nil {
		t.Fatal(err)
	}
	// The one the deployment's set (DeleteOldest) would remove last: the
	// newest, and among those made in the same second the last by name.
	newest := slices.MaxFunc(before, func(a, b machinistv1.Machine) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	victim, err := r.get("machines", ns, newest.Name)
	if err != nil {
		t.Fatal(err)
	}
	r.deleteNode("machinedeployments", ns, md.Name, victim)

	testenv.WaitFor(t, time.Minute, "the marked Machine gone", func() bool {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim.GetName()}, &machinistv1.Machine{})
		return apierrors.IsNotFound(err)
	})
	after := running(t, ns, "workers", 2)
	want := slices.DeleteFunc(names(before), func(n string) bool { return n == victim.GetName() })
	if got := names(after); !slices.Equal(got, want) {
		t.Fatalf("Machines after the scale-down: %v, want %v (only the marked one removed, none created)", got, want)
	}
	if n := r.replicas("machinedeployments", ns, md.Name); n != 2 {
		t.Fatalf("the deployment's size is %d, want 2", n)
	}
}

// TestARolloutKeepsTheAutoscalerFromScalingDown: while a rollout has an
// older MachineSet with Machines, the autoscaler's rollout check, which
// reads Cluster API's deployment-name label and revision annotation on
// the sets, says the deployment is rolling out; once it is done, it says
// not.
func TestARolloutKeepsTheAutoscalerFromScalingDown(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "rollout", testenv.Small)
	md := workers(t, ns, "workers", 2)
	running(t, ns, "workers", 2)
	if r.rollingOut(ns, md.Name) {
		t.Fatal("a deployment at rest is taken for rolling out")
	}
	// The rollout's deletions wait for this budget, so the rollout stays
	// half done until it goes.
	hold := testenv.Budget(ns, "hold", "workers", 0, machinistv1.DisruptionRollout)
	if err := env.Client.Create(ctx, hold); err != nil {
		t.Fatal(err)
	}
	change := []byte(`{"spec":{"template":{"metadata":{"labels":{"rev":"2"}}}}}`)
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, change)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "two MachineSets, both named for the autoscaler", func() error {
		var sets machinistv1.MachineSetList
		if err := env.Client.List(ctx, &sets, client.InNamespace(ns)); err != nil {
			return err
		}
		var revs []string
		for _, ms := range sets.Items {
			if ms.Labels[machinistv1.DeploymentNameLabel] != md.Name {
				return fmt.Errorf("MachineSet %s is labelled %v", ms.Name, ms.Labels)
			}
			if a := ms.Annotations; a[machinistv1.DeploymentRevisionAnnotation] != a[machinistv1.RevisionAnnotation] {
				return fmt.Errorf("MachineSet %s: revision %q for the autoscaler, %q", ms.Name, a[machinistv1.DeploymentRevisionAnnotation], a[machinistv1.RevisionAnnotation])
			}
			revs = append(revs, ms.Annotations[machinistv1.DeploymentRevisionAnnotation])
		}
		if slices.Sort(revs); !slices.Equal(revs, []string{"1", "2"}) {
			return fmt.Errorf("revisions %v", revs)
		}
		return nil
	})
	testenv.WaitFor(t, time.Minute, "the autoscaler to see the rollout", func() bool { return r.rollingOut(ns, md.Name) })

	if err := env.Client.Delete(ctx, hold); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the rollout done, and seen so", func() bool { return !r.rollingOut(ns, md.Name) })
	running(t, ns, "workers", 2)
}

// TestAGroupAtZeroSaysWhatItsNodesWouldBe: a MachineDeployment and a
// MachineSet at zero carry the capacity annotations the autoscaler
// scales up from zero with, from their class's nodeTemplate and their
// template's own labels and taints; they follow the class, and a value a
// person set stays. A set that a deployment owns carries none: its
// deployment is the node group.
func TestAGroupAtZeroSaysWhatItsNodesWouldBe(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "zero")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sized"},
		Spec: machinistv1.MachineClassSpec{Provider: "inmemory", NodeTemplate: &machinistv1.NodeTemplate{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
				corev1.ResourcePods: resource.MustParse("50"),
			},
			NodeLabels: machinistv1.NodeLabels{"tier": "workers"},
			NodeTaints: machinistv1.NodeTaints{{Key: "dedicated", Value: "batch", Effect: corev1.TaintEffectNoSchedule}},
		}},
	}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}
	md := testenv.MachineDeployment(ns, "workers", 0)
	md.Annotations = map[string]string{minSizeKey: "0", maxSizeKey: "5"}
	md.Spec.Template.Spec.ClassRef.Name = class.Name
	md.Spec.Template.Spec.NodeLabels = machinistv1.NodeLabels{"pool": "workers"}
	ms := testenv.MachineSet(ns, "standalone", 0)
	ms.Spec.Template.Spec.ClassRef.Name = class.Name
	for _, o := range []client.Object{md, ms} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	published := func(plural, name string, want map[string]string) func() error {
		return func() error {
			u, err := r.get(plural, ns, name)
			if err != nil {
				return err
			}
			got := map[string]string{}
			for k, v := range u.GetAnnotations() {
				if strings.HasPrefix(k, "capacity.cluster-autoscaler.kubernetes.io/") {
					got[k] = v
				}
			}
			if !maps.Equal(got, want) {
				return fmt.Errorf("%s %s says %v, want %v", plural, name, got, want)
			}
			return nil
		}
	}
	want := map[string]string{
		template.CPUAnnotation: "4", template.MemoryAnnotation: "8Gi", template.MaxPodsAnnotation: "50",
		template.LabelsAnnotation: "pool=workers,tier=workers", template.TaintsAnnotation: "dedicated=batch:NoSchedule",
	}
	testenv.WaitFor(t, 30*time.Second, "the deployment's capacity published", published("machinedeployments", md.Name, want))
	standalone := maps.Clone(want)
	standalone[template.LabelsAnnotation] = "tier=workers"
	testenv.WaitFor(t, 30*time.Second, "the standalone set's capacity published", published("machinesets", ms.Name, standalone))
	if r.replicas("machinedeployments", ns, md.Name) != 0 {
		t.Fatal("the deployment is not at zero")
	}

	// A person says the memory themselves; the class then grows.
	mine := []byte(`{"metadata":{"annotations":{"` + template.MemoryAnnotation + `":"6Gi"}}}`)
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, mine)); err != nil {
		t.Fatal(err)
	}
	grow := []byte(`{"spec":{"nodeTemplate":{"capacity":{"cpu":"8","memory":"16Gi","pods":null}}}}`)
	if err := env.Client.Patch(ctx, class, client.RawPatch(types.MergePatchType, grow)); err != nil {
		t.Fatal(err)
	}
	want[template.CPUAnnotation], want[template.MemoryAnnotation] = "8", "6Gi"
	delete(want, template.MaxPodsAnnotation)
	testenv.WaitFor(t, 30*time.Second, "the deployment to follow its class but for the person's memory", published("machinedeployments", md.Name, want))
	standalone[template.CPUAnnotation], standalone[template.MemoryAnnotation] = "8", "16Gi"
	delete(standalone, template.MaxPodsAnnotation)
	testenv.WaitFor(t, 30*time.Second, "the standalone set to follow its class", published("machinesets", ms.Name, standalone))

	// The deployment's own sets are not node groups.
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":1}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the deployment's set", func() error {
		var sets machinistv1.MachineSetList
		if err := env.Client.List(ctx, &sets, client.InNamespace(ns), client.MatchingLabels{machinistv1.DeploymentNameLabel: md.Name}); err != nil {
			return err
		}
		if len(sets.Items) != 1 {
			return fmt.Errorf("%d sets", len(sets.Items))
		}
		for k := range sets.Items[0].Annotations {
			if strings.HasPrefix(k, "capacity.cluster-autoscaler.kubernetes.io/") || k == template.PublishedAnnotation {
				t.Fatalf("the deployment's MachineSet publishes %s", k)
			}
		}
		return nil
	})
}

// TestAFailedMachineIsSeenFailed: a Machine that failed carries
// status.failureMessage, which is how the autoscaler tells a failed
// instance and backs its group off; a Running one carries none.
func TestAFailedMachineIsSeenFailed(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "failed", testenv.Small, testenv.Class{Name: "quota", Spec: `{"failCreate":"quota exceeded"}`})
	bad := testenv.MachineSet(ns, "bad", 1)
	bad.Spec.Template.Spec.ClassRef.Name = "quota"
	good := testenv.MachineSet(ns, "good", 1)
	for _, o := range []client.Object{bad, good} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	running(t, ns, "good", 1)
	testenv.WaitFor(t, time.Minute, "the bad set's Machine seen failed", func() error {
		in := r.instances("machinesets", ns, bad.Name)
		if len(in) != 1 || !in[0].failed || in[0].state != "creating" {
			return fmt.Errorf("instances %+v", in)
		}
		return nil
	})
	list, err := r.dyn.Resource(r.resource("machines")).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: "pool=bad"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the bad set's Machines: %v, %v", list, err)
	}
	msg, _, _ := unstructured.NestedString(list.Items[0].Object, "status", "failureMessage")
	if !strings.Contains(msg, "quota exceeded") {
		t.Errorf("failureMessage %q does not say why", msg)
	}
	for _, in := range r.instances("machinesets", ns, good.Name) {
		if in.failed || in.state != "running" {
			t.Errorf("the good set's instance %+v", in)
		}
	}
}

// TestDiscoveryByClusterFindsTheWholeWay: with --node-group-auto-discovery
// naming a cluster, the autoscaler drops every object on the way from a
// Node to its node group whose cluster is another: the Machine, its
// MachineSet and the MachineDeployment each say theirs. (The cluster need
// not exist for this: its Machines wait for it.)
func TestDiscoveryByClusterFindsTheWholeWay(t *testing.T) {
	ctx := context.Background()
	r := newReader(t)
	ns := env.NewNamespace(t, "discovery", testenv.Small)
	md := testenv.MachineDeployment(ns, "edge-workers", 1)
	md.Spec.Template.Spec.ClusterName = "edge"
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the deployment, its set and its Machine in cluster edge", func() error {
		u, err := r.get("machinedeployments", ns, md.Name)
		if err != nil {
			return err
		}
		if c := clusterOf(u); c != "edge" {
			return fmt.Errorf("the deployment's cluster is %q", c)
		}
		for _, plural := range []string{"machinesets", "machines"} {
			list, err := r.dyn.Resource(r.resource(plural)).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(list.Items) == 0 {
				return fmt.Errorf("no %s yet", plural)
			}
			for i := range list.Items {
				if c := clusterOf(&list.Items[i]); c != "edge" {
					return fmt.Errorf("%s %s's cluster is %q", plural, list.Items[i].GetName(), c)
				}
			}
		}
		return nil
	})
}
