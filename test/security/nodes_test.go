package security_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A machine's bootstrap token may become a certificate for a Node of any
// new name, and a Node says its own providerID. A second Node that claims
// a running Machine's instance, reporting itself not Ready, is taken for
// that Machine's Node by neither the Machine controller nor a health
// check: the Machine keeps its Node and is not remediated.
func TestANodeClaimingAnotherMachinesInstanceIsNotItsNode(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, "impostor")
	victim := machine(ns, "victim")
	victim.Labels = map[string]string{"pool": "victim"}
	running(t, env.Client, victim)
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "victim"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "victim"}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{{Action: machinistv1.RemediateReboot, Timeout: &metav1.Duration{Duration: time.Minute}}}},
		},
	}
	if err := env.Client.Create(ctx, hc); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, "the victim judged healthy", victim, func(m *machinistv1.Machine) error {
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("%s %+v", machinistv1.ConditionHealthCheckSucceeded, c)
		}
		return nil
	})
	node, boot := victim.Status.NodeRef.Name, victim.Status.BootID

	// A machine of the cluster, as a kubelet joins: its own token, its
	// own certificate, and a Node of its own that names the victim's
	// instance.
	name := "impostor-" + rand.String(5)
	impostor := env.NodeClient(t, name)
	n, err := impostor.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{ProviderID: victim.Status.ProviderID},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	if n.Spec.ProviderID != victim.Status.ProviderID {
		t.Fatalf("the impostor's Node was stored with providerID %q, so the test proves nothing", n.Spec.ProviderID)
	}
	// Many looks of both controllers: each change of the impostor's
	// Node wakes them, as a kubelet's reports would, and the health check
	// looks again after its timeout.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "Impostor",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
		n.Status.NodeInfo.BootID = fmt.Sprintf("impostors-boot-%d", i)
		if n, err = impostor.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(victim), victim); err != nil {
			t.Fatal(err)
		}
		ref, rem, op := victim.Status.NodeRef, victim.Status.Remediation, victim.Status.Operation
		if ref == nil || ref.Name != node || victim.Status.BootID != boot || op != nil ||
			(rem != nil && rem.Phase != machinistv1.RemediationHealthy) {
			t.Fatalf("the impostor's Node was taken for the victim's: nodeRef %+v (was %s), boot ID %s (was %s), operation %+v, remediation %+v",
				ref, node, victim.Status.BootID, boot, op, rem)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
