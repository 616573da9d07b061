package apifaults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// The Machine controller sets its taints on the Node from a cached copy,
// and the Node's taints are one list: a taint another writer (the node
// lifecycle controller, a user) added since the cache saw the Node must
// survive the controller's next change of its own.
func TestATaintAddedByAnotherWriterSurvives(t *testing.T) {
	// The manager sees Nodes two seconds late.
	start(t, 41, faults.Rule{Name: "lagging-nodes", Fault: faults.Latency, Verbs: []string{"watch"}, Resources: []string{"nodes"},
		Rate: 1, Delay: metav1.Duration{Duration: 2 * time.Second}})
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m := running(t, ns, "m1")
	testenv.WaitFor(t, 30*time.Second, "m1's Node", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil && m.Status.NodeRef != nil
	})
	nodeKey := client.ObjectKey{Name: m.Status.NodeRef.Name}
	// Someone else's taint, then at once a taint of the Machine's own.
	theirs := corev1.Taint{Key: "example.com/theirs", Effect: corev1.TaintEffectNoSchedule}
	var node corev1.Node
	if err := env.Client.Get(ctx, nodeKey, &node); err != nil {
		t.Fatal(err)
	}
	node.Spec.Taints = append(node.Spec.Taints, theirs)
	if err := env.Client.Update(ctx, &node); err != nil {
		t.Fatal(err)
	}
	mine := `{"spec":{"nodeTaints":[{"key":"machinist.dev/mine","effect":"NoSchedule"}]}}`
	if err := env.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(mine))); err != nil {
		t.Fatal(err)
	}
	has := func(n *corev1.Node, key string) bool {
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
	}
	testenv.WaitFor(t, 30*time.Second, "the Machine's taint on the Node", func() bool {
		return env.Client.Get(ctx, nodeKey, &node) == nil && has(&node, "machinist.dev/mine")
	})
	if !has(&node, "example.com/theirs") {
		t.Fatalf("the Node's taints became %v: another writer's taint was written over from a stale copy", node.Spec.Taints)
	}
	// And after the lagging cache has caught up: nothing is to change in
	// three seconds, in which a write from a stale copy would show.
	time.Sleep(3 * time.Second)
	if err := env.Client.Get(ctx, nodeKey, &node); err != nil {
		t.Fatal(err)
	}
	if !has(&node, "example.com/theirs") || !has(&node, "machinist.dev/mine") {
		t.Fatalf("the Node's taints are %v: another writer's taint was written over from a stale copy", node.Spec.Taints)
	}
}

// A MachineDeployment resizes its sets with sizes computed from all of
// them at once: a resize answered 504 and stored seconds later must not
// write an old size over a newer one.
func TestALateResizeDoesNotUndoANewerOne(t *testing.T) {
	start(t, 42, faults.Rule{Name: "late-resize", Fault: faults.LateCommit, Verbs: []string{"patch"}, Resources: []string{"machinesets"},
		Rate: 1, Limit: 1, Delay: metav1.Duration{Duration: 4 * time.Second}})
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	seen := watchMachines(t, ns)
	md := deployment(ns, 2, machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy, RollingUpdate: &machinistv1.RollingUpdate{
		MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}, "v1.37.2")
	// The set is created at its size; its first resize is the one
	// answered late.
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	settled(t, ns, 2, time.Minute)
	scaleTo := func(n int32) {
		t.Helper()
		p := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)))
		if err := env.Client.Patch(ctx, md, p); err != nil {
			t.Fatal(err)
		}
	}
	scaleTo(5)
	// The resize to 5 is answered 504; the deployment writes it again.
	testenv.WaitFor(t, 30*time.Second, "the set resized to 5", func() bool { return setSize(t, ns) == 5 })
	scaleTo(2)
	testenv.WaitFor(t, 30*time.Second, "the set resized to 2", func() bool { return setSize(t, ns) == 2 })
	settle, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proxy.Settle(settle); err != nil {
		t.Fatal(err)
	}
	stored, refused := proxy.Late()
	settled(t, ns, 2, time.Minute)
	// Nothing is to happen now: what a late resize stored after the set
	// had settled would show within twice the watch's lag.
	time.Sleep(2 * watchLag)
	settled(t, ns, 2, time.Minute)
	created, _ := seen.counts()
	t.Logf("%d resize answered 504: %d stored later, %d refused; %d Machines created in all", proxy.Struck("late-resize"), stored, refused, created)
	if proxy.Struck("late-resize") != 1 {
		t.Fatal("no resize was answered 504: the test proved nothing")
	}
	if stored != 0 || created != 5 {
		t.Fatalf("the late resize to 5 was stored over the resize to 2 (%d stored): %d Machines created, want 5", stored, created)
	}
}

// setSize is the size the one MachineSet of ns is asked for.
func setSize(t *testing.T, ns string) int32 {
	t.Helper()
	var sets machinistv1.MachineSetList
	if err := env.Client.List(context.Background(), &sets, client.InNamespace(ns)); err != nil || len(sets.Items) != 1 {
		return -1
	}
	return ptr.Deref(sets.Items[0].Spec.Replicas, 1)
}
