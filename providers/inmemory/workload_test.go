package inmemory_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers"
)

// The provider knows no cluster: its Machine's Node lives in a workload
// cluster it holds no credentials for, and a repair still registers it
// afresh, by the machine with the repair's token.
func TestRepairRegistersAfreshInAWorkloadCluster(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	workload, err := testenv.StartWorkload()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(workload.Stop()).To(Succeed()) })
	admin := kubernetes.NewForConfigOrDie(workload.Config)
	p := newProvider(t)
	m, class := machine(t, "workload", "m", "")
	created := workload.JoinData(t)
	id, err := p.Create(ctx, m, class, created)
	g.Expect(err).NotTo(HaveOccurred())
	name, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	readyNode := func(g Gomega) *corev1.Node {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
		return n
	}
	var before *corev1.Node
	g.Eventually(func(g Gomega) { before = readyNode(g) }).WithTimeout(wait).Should(Succeed())
	_, err = admin.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType,
		[]byte(`{"metadata":{"labels":{"team":"a"}},"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	repaired := workload.JoinData(t)
	repairer, err := bootstrap.ParseToken(repaired.Token)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "r-1", Join: repaired})).To(Succeed())
	g.Eventually(func(g Gomega) {
		n := readyNode(g)
		g.Expect(n.UID).NotTo(Equal(before.UID), "registered afresh")
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(before.Status.NodeInfo.BootID))
		g.Expect(n.Labels).NotTo(HaveKey("team"))
		g.Expect(n.Spec.Taints).NotTo(ContainElement(HaveField("Key", "dedicated")))
	}).WithTimeout(wait).Should(Succeed())

	// Its certificate was asked for with the repair's token, and issued.
	csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(csrs.Items).To(ContainElement(And(
		HaveField("Spec.Username", repairer.User()),
		HaveField("Status.Conditions", ContainElement(HaveField("Type", certificatesv1.CertificateApproved))),
		HaveField("Status.Certificate", Not(BeEmpty())),
	)))
	_, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Node in the management cluster: %v", err)
}
