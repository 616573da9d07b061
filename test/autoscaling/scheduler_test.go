package autoscaling

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestTheSchedulerFitsPodsToTheMachinesNodes: the real kube-scheduler
// binds pods to Machines' Nodes by the allocatable their class's
// nodeTemplate gives them, the node agents run them, and a pod that fits
// on none is marked PodScheduled=False, Unschedulable: the pod the
// autoscaler scales a group up for, by the same nodeTemplate. Nothing
// here binds a pod but kube-scheduler.
func TestTheSchedulerFitsPodsToTheMachinesNodes(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "schedule")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "four"},
		Spec: machinistv1.MachineClassSpec{Provider: "inmemory", NodeTemplate: &machinistv1.NodeTemplate{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
				corev1.ResourcePods: resource.MustParse("110"),
			},
		}},
	}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}
	// The other tests' Nodes are in the same cluster, some as large: the
	// pods go to this test's alone, by a label only its Nodes carry.
	pool := map[string]string{"scheduling-test": ns}
	md := testenv.MachineDeployment(ns, "workers", 2)
	md.Spec.Template.Spec.ClassRef.Name = class.Name
	md.Spec.Template.Spec.NodeLabels = pool
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, m := range running(t, ns, "workers", 2) {
		mine[m.Status.NodeRef.Name] = true
	}
	testenv.WaitFor(t, time.Minute, "both Nodes labelled, untainted, with the class's capacity allocatable", func() error {
		for name := range mine {
			var node corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
				return err
			}
			if node.Labels["scheduling-test"] != ns {
				return fmt.Errorf("Node %s is labelled %v", name, node.Labels)
			}
			// kube-apiserver taints a new Node not-ready; the node
			// lifecycle controller lifts it once the Node is Ready.
			if len(node.Spec.Taints) > 0 {
				return fmt.Errorf("Node %s is tainted %v", name, node.Spec.Taints)
			}
			if cpu := node.Status.Allocatable[corev1.ResourceCPU]; cpu.Cmp(resource.MustParse("4")) != 0 {
				return fmt.Errorf("Node %s has %s cpu allocatable, want 4", name, cpu.String())
			}
		}
		return nil
	})

	pod := func(name string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{
				NodeSelector: pool,
				Containers: []corev1.Container{{
					Name: "app", Image: "registry.invalid/app:1",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}},
				}},
			},
		}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p) })
		return p
	}
	// Two pods of 3 cpu: one on each 4-cpu Node, never both on one.
	placed := []*corev1.Pod{pod("a"), pod("b")}
	testenv.WaitFor(t, time.Minute, "both pods bound to distinct Nodes of the Machines and Running", func() error {
		used := map[string]bool{}
		for _, want := range placed {
			p := &corev1.Pod{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(want), p); err != nil {
				return err
			}
			switch {
			case p.Spec.NodeName == "":
				return fmt.Errorf("pod %s is not bound (%v)", p.Name, p.Status.Conditions)
			case !mine[p.Spec.NodeName]:
				t.Fatalf("pod %s is bound to Node %s, none of the Machines' %v", p.Name, p.Spec.NodeName, mine)
			case used[p.Spec.NodeName]:
				t.Fatalf("pods a and b are both bound to Node %s, which has 4 cpu for their 6", p.Spec.NodeName)
			case p.Status.Phase != corev1.PodRunning:
				return fmt.Errorf("pod %s on %s is %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			}
			used[p.Spec.NodeName] = true
		}
		return nil
	})

	// A third fits on neither: the scheduler says so, and binds it nowhere.
	testenv.WaitForObject(t, env.Client, time.Minute, "the third pod PodScheduled=False, Unschedulable", pod("c"), func(p *corev1.Pod) error {
		if p.Spec.NodeName != "" {
			t.Fatalf("pod c is bound to Node %s, which has 1 cpu left for its 3", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return nil
			}
		}
		return fmt.Errorf("pod c's conditions: %v", p.Status.Conditions)
	})
}
