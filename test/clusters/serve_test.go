package clusters

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes"
)

// One manager serves its own cluster and two workload clusters at once.
// In each, a MachineDeployment's Machines join that cluster and no other,
// with tokens that are gone once they have joined; it scales, rolls to a
// new version, takes a reboot through the verbs, and a health check heals
// a machine that was killed.
func TestOneManagerServesItsOwnClusterAndTwoWorkloadClusters(t *testing.T) {
	t.Parallel()
	ns := env.NewNamespace(t, "serve", testenv.Small)
	serve(t, ns)
	for _, cluster := range []string{"", blue, green} {
		name := cluster
		if name == "" {
			name = "own"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			exercise(t, ns, name, cluster)
		})
	}
}

func exercise(t *testing.T, ns, pool, cluster string) {
	ctx := context.Background()
	md := testenv.MachineDeployment(ns, pool, 2)
	md.Spec.Template.Spec.ClusterName = cluster
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	inPool := client.MatchingLabels{"pool": pool}

	ms := running(t, ns, 2, 2*time.Minute, inPool)
	for i := range ms {
		joinedOnlyTo(t, &ms[i], cluster)
	}
	testenv.WaitFor(t, 30*time.Second, "no bootstrap token left for the pool's Machines in "+pool, func() error {
		return noTokensFor(ctx, kube(t, cluster), ms)
	})
	issued(t, cluster, ms)

	// Scale.
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`))); err != nil {
		t.Fatal(err)
	}
	ms = running(t, ns, 3, 2*time.Minute, inPool)
	for i := range ms {
		joinedOnlyTo(t, &ms[i], cluster)
	}

	// Roll to a new version: every Machine replaced by one that joins
	// the same cluster.
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"version":"v1.37.3"}}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the pool rolled to v1.37.3", func() error {
		ms, err := testenv.ListMachines(ctx, env.Client, ns, inPool)
		if err != nil {
			return err
		}
		rolled := 0
		for i := range ms {
			if ms[i].Spec.Version == "v1.37.3" && ms[i].Status.Phase == machinistv1.MachineRunning && ms[i].DeletionTimestamp.IsZero() {
				rolled++
			}
		}
		if len(ms) != 3 || rolled != 3 {
			return fmt.Errorf("%d Machines, %d rolled and Running", len(ms), rolled)
		}
		return nil
	})
	ms = running(t, ns, 3, time.Minute, inPool)
	for i := range ms {
		node := joinedOnlyTo(t, &ms[i], cluster)
		if node.Status.NodeInfo.KubeletVersion != "v1.37.3" {
			t.Errorf("the Node of rolled Machine %s reports kubelet %s", ms[i].Name, node.Status.NodeInfo.KubeletVersion)
		}
	}

	// A reboot through the verbs server.
	m := &ms[0]
	before := joinedOnlyTo(t, m, cluster).Status.NodeInfo.BootID
	var code int
	err := kube(t, "").CoreV1().RESTClient().Put().
		AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, "reboot").
		Body([]byte(`{}`)).Do(ctx).StatusCode(&code).Error()
	if err != nil || code != 202 {
		t.Fatalf("reboot of %s answered %d: %v", m.Name, code, err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, m.Name+" rebooted", m, func(m *machinistv1.Machine) error {
		if op := m.Status.Operation; op == nil || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("operation %+v", m.Status.Operation)
		}
		return nil
	})
	if after := joinedOnlyTo(t, m, cluster).Status.NodeInfo.BootID; after == before {
		t.Errorf("the Node of %s kept boot ID %s through a reboot", m.Name, after)
	}

	// A health check heals a killed machine.
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 3 * time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 3 * time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{
				{Action: machinistv1.RemediateReboot, Mode: machinistv1.RebootHard, Timeout: &metav1.Duration{Duration: time.Minute}},
				{Action: machinistv1.RemediateReplace},
			}},
		},
	}
	if err := env.Client.Create(ctx, hc); err != nil {
		t.Fatal(err)
	}
	victim := &ms[1]
	if err := ctrls.Provider.Crash(victim.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the health check to heal "+victim.Name, func() error {
		n, err := ctrls.Provider.Restarts(victim.Status.ProviderID)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("not restarted yet")
		}
		return nil
	})
	ms = running(t, ns, 3, 2*time.Minute, inPool)
	testenv.WaitFor(t, time.Minute, "every Node of the pool Ready in its cluster", func() error {
		for i := range ms {
			node := nodeOf(t, cluster, ms[i].Status.ProviderID)
			if node == nil || !nodes.Ready(node) {
				return fmt.Errorf("the Node of %s is not Ready", ms[i].Name)
			}
		}
		return nil
	})
}

// joinedOnlyTo checks that m's Node is in cluster and in no other, and
// returns it.
func joinedOnlyTo(t *testing.T, m *machinistv1.Machine, cluster string) *corev1.Node {
	t.Helper()
	var found *corev1.Node
	for name := range workloads {
		node := nodeOf(t, name, m.Status.ProviderID)
		switch {
		case name == cluster && node == nil:
			t.Fatalf("Machine %s (cluster %q) has no Node in its cluster", m.Name, cluster)
		case name != cluster && node != nil:
			t.Fatalf("Machine %s (cluster %q) has a Node in cluster %q", m.Name, cluster, name)
		case name == cluster:
			found = node
		}
	}
	return found
}

// noTokensFor reports the bootstrap tokens still there for ms.
func noTokensFor(ctx context.Context, k kubernetes.Interface, ms []machinistv1.Machine) error {
	secrets, err := k.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: nodes.TokenMachineLabel})
	if err != nil {
		return err
	}
	uids := map[string]string{}
	for i := range ms {
		uids[string(ms[i].UID)] = ms[i].Name
	}
	var left []string
	for _, s := range secrets.Items {
		if name, ok := uids[s.Labels[nodes.TokenMachineLabel]]; ok {
			left = append(left, name)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("tokens left for %s", strings.Join(left, ", "))
	}
	return nil
}

// issued checks that every Machine's Node got its certificate through an
// approved, issued CertificateSigningRequest of the kubelet client signer,
// asked for with a bootstrap token.
func issued(t *testing.T, cluster string, ms []machinistv1.Machine) {
	t.Helper()
	csrs, err := kube(t, cluster).CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms {
		node := nodeOf(t, cluster, ms[i].Status.ProviderID)
		ok := false
		for _, csr := range csrs.Items {
			if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName ||
				!strings.HasPrefix(csr.Spec.Username, "system:bootstrap:") || len(csr.Status.Certificate) == 0 {
				continue
			}
			approved := false
			for _, c := range csr.Status.Conditions {
				approved = approved || (c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue)
			}
			if approved && commonName(t, csr.Spec.Request) == "system:node:"+node.Name {
				ok = true
			}
		}
		if !ok {
			t.Errorf("no approved and issued CertificateSigningRequest of system:node:%s, asked with a bootstrap token, in cluster %q", node.Name, cluster)
		}
	}
}

// commonName is the subject common name of a PEM certificate request.
func commonName(t *testing.T, request []byte) string {
	t.Helper()
	block, _ := pem.Decode(request)
	if block == nil {
		t.Fatal("a CertificateSigningRequest holds no PEM request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return req.Subject.CommonName
}
