package clusters

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A WorkloadCluster whose kubeconfig is no kubeconfig says so, and so do
// its Machines, which wait; the cluster writes at most once per backoff
// step, and each Machine once.
func TestABadKubeconfigShowsUnreachableWithBoundedWrites(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.NewNamespace(t, "broken", testenv.Small)
	clusters, err := env.Watch(ctx, ns, func() client.ObjectList { return &machinistv1.WorkloadClusterList{} })
	if err != nil {
		t.Fatal(err)
	}
	machines, err := env.WatchMachines(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "broken-kubeconfig"},
		Data:       map[string][]byte{"value": []byte("this is not a kubeconfig")},
	}
	wc := &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "broken"},
		Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: secret.Name}},
	}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waits"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, ClusterName: wc.Name},
	}
	for _, o := range []client.Object{secret, wc, m} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the WorkloadCluster Unreachable", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonKubeconfigInvalid {
			return fmt.Errorf("Reachable %+v", c)
		}
		return nil
	})
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the Machine waiting on its cluster", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		if c == nil || c.Reason != machinistv1.ReasonClusterUnreachable || !strings.Contains(c.Message, machinistv1.ReasonKubeconfigInvalid) {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if m.Status.Phase != machinistv1.MachinePending || m.Status.ProviderID != "" {
		t.Errorf("a Machine of an unreachable cluster went on: phase %s, providerID %q", m.Status.Phase, m.Status.ProviderID)
	}

	// From here on: the cluster's status settles, and the Machine, which
	// said once why it waits, is written no more: its cluster's
	// reachability wakes it, not retries.
	drain(clusters)
	drain(machines)
	window := 30 * time.Second
	time.Sleep(window) // a window of writes counted, not a wait for a state
	clusterWrites, machineWrites := drain(clusters), drain(machines)
	t.Logf("in %s: %d writes to the WorkloadCluster, %d to the Machine", window, len(clusterWrites), len(machineWrites))
	for _, e := range clusterWrites {
		t.Logf("WorkloadCluster %s: %+v", e.Type, e.Object.(*machinistv1.WorkloadCluster).Status)
	}
	if len(clusterWrites) > 0 {
		t.Errorf("an unreachable WorkloadCluster was written %d times in %s with nothing new to say", len(clusterWrites), window)
	}
	if len(machineWrites) > 0 {
		t.Errorf("a Machine waiting on an unreachable cluster was written %d times in %s with nothing new to say", len(machineWrites), window)
	}

	// Fixed, the cluster is reached and the Machine goes on.
	kubeconfig, err := readKubeconfig(blue)
	if err != nil {
		t.Fatal(err)
	}
	secret.Data = map[string][]byte{"value": kubeconfig}
	if err := env.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the Machine Running once its cluster is reachable", m, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineRunning {
			return fmt.Errorf("phase %s", m.Status.Phase)
		}
		return nil
	})
	joinedOnlyTo(t, m, blue)
	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the Machine gone", func() error {
		if nodeOf(t, blue, m.Status.ProviderID) != nil {
			return fmt.Errorf("its Node is still in cluster blue")
		}
		return client.IgnoreNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(m), m))
	})
}

// A WorkloadCluster deleted while Machines serve it waits for them, and
// says so; it goes once they have.
func TestDeletingAWorkloadClusterWaitsForItsMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "leaving", testenv.Small)
	serve(t, ns)
	runPool(t, ns, "leaving", green, 2)
	wc := &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: green}}
	if err := env.Client.Delete(ctx, wc); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the WorkloadCluster waiting for its Machines", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterDeleting)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != machinistv1.ReasonWaitingForMachines || !strings.Contains(c.Message, "2 Machines") {
			return fmt.Errorf("Deleting %+v", c)
		}
		return nil
	})
	// Still there a while later: nothing but its Machines' going frees it.
	time.Sleep(3 * time.Second) // the finalizer must hold; there is no state to wait for
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(wc), wc); err != nil {
		t.Fatalf("the WorkloadCluster went while its Machines were there: %v", err)
	}
	ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaving"}}
	if err := env.Client.Patch(ctx, ms, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the WorkloadCluster gone with its Machines", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(wc), wc)
		if err == nil {
			return fmt.Errorf("still there: %d Machines", ptr.Deref(wc.Status.Machines, -1))
		}
		return client.IgnoreNotFound(err)
	})
	for _, n := range mustNodes(t, green) {
		if strings.HasPrefix(n.Name, "leaving-") {
			t.Errorf("Node %s of a deleted Machine is still in cluster green", n.Name)
		}
	}
}

// drain takes the events delivered on ch until none has come for a
// second: the watch hands them over one at a time.
func drain(ch <-chan watch.Event) []watch.Event {
	var out []watch.Event
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				// The watch ended: what it would have shown is not known.
				return append(out, watch.Event{Type: watch.Error})
			}
			out = append(out, e)
		case <-time.After(time.Second):
			return out
		}
	}
}

func mustNodes(t *testing.T, cluster string) []corev1.Node {
	t.Helper()
	list, err := kube(t, cluster).CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}
