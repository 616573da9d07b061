package clusters

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/testenv"
)

// A health check does not judge a Machine whose cluster cannot be
// reached, holds nothing against it, and says so on the Machine; once the
// cluster is back, the Machine is judged again. The cluster here is down
// for real: its kube-apiserver killed.
func TestAMachineOfAClusterThatIsDownIsNotJudged(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "down", testenv.Small)
	w, err := testenv.StartWith(testenv.Options{Workload: true, ControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	kubeconfig, err := os.ReadFile(w.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fading-kubeconfig"},
		Data:       map[string][]byte{machinistv1.DefaultKubeconfigKey: kubeconfig},
	}
	wc := &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fading"},
		Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: secret.Name}},
	}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "far", Labels: map[string]string{"pool": "far"}},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, ClusterName: wc.Name},
	}
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "far"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "far"}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 3 * time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{{Action: machinistv1.RemediateReplace}}},
		},
	}
	for _, o := range []client.Object{secret, wc, m, hc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	judged := func(status metav1.ConditionStatus, reason string) func(*machinistv1.Machine) error {
		return func(m *machinistv1.Machine) error {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
			if m.Status.Phase != machinistv1.MachineRunning || c == nil || c.Status != status || c.Reason != reason {
				return fmt.Errorf("phase %s, %s %+v", m.Status.Phase, machinistv1.ConditionHealthCheckSucceeded, c)
			}
			return nil
		}
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the Machine Running and judged healthy", m,
		judged(metav1.ConditionTrue, machinistv1.ReasonPassed))
	uid := m.UID

	if err := w.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, "the WorkloadCluster Unreachable", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonUnreachable {
			return fmt.Errorf("Reachable %+v", c)
		}
		return nil
	})
	// The probe (every 5s here) finds it down; the Node's Lease, last
	// renewed before, would be long expired by the time the Machine is
	// looked at, were it judged.
	testenv.WaitForObject(t, env.Client, time.Minute, "the Machine unjudged, and saying why", m,
		judged(metav1.ConditionUnknown, machinistv1.ReasonClusterUnreachable))
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
	if !strings.Contains(c.Message, "WorkloadCluster fading is not reachable (Unreachable)") {
		t.Errorf("the condition's message: %q", c.Message)
	}
	// The health check says why, once.
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the health check saying why", hc, func(hc *machinistv1.MachineHealthCheck) error {
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionClustersReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonClusterUnreachable ||
			!strings.Contains(c.Message, "WorkloadCluster fading (Unreachable): 1") {
			return fmt.Errorf("%s %+v", machinistv1.ConditionClustersReachable, c)
		}
		return nil
	})
	// Well past the check's timeout, nothing is held against it.
	time.Sleep(10 * time.Second) // a window in which nothing may happen, not a wait for a state
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	if m.UID != uid || !m.DeletionTimestamp.IsZero() || m.Status.Remediation != nil || m.Status.Operation != nil {
		t.Fatalf("a Machine of a cluster that is down was remediated: deleting %v, remediation %+v, operation %+v",
			!m.DeletionTimestamp.IsZero(), m.Status.Remediation, m.Status.Operation)
	}

	if err := w.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the Machine judged again once its cluster is back", m,
		judged(metav1.ConditionTrue, machinistv1.ReasonPassed))
	if m.UID != uid || m.Status.Remediation != nil {
		t.Errorf("the Machine was replaced or remediated: uid %s -> %s, remediation %+v", uid, m.UID, m.Status.Remediation)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the health check saying the cluster is back", hc, func(hc *machinistv1.MachineHealthCheck) error {
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionClustersReachable)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != machinistv1.ReasonClustersReachable {
			return fmt.Errorf("%s %+v", machinistv1.ConditionClustersReachable, c)
		}
		return nil
	})
	// One Event each way for the outage.
	testenv.WaitFor(t, 10*time.Second, "one Event each way", func() error {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		got := map[string]int{}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "MachineHealthCheck" && e.InvolvedObject.Name == hc.Name {
				got[e.Reason] += max(int(e.Count), 1)
			}
		}
		if got[machinistv1.ReasonClusterUnreachable] != 1 || got["ClusterReachable"] != 1 {
			return fmt.Errorf("the health check's Events by reason: %v", got)
		}
		return nil
	})
}
