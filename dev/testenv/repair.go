package testenv

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers"
)

// NodeNamer is a provider that says which Node an instance registers.
type NodeNamer interface {
	providers.Actuator
	NodeName(providerID string) (string, error)
}

// CheckRepairRegistersAfresh starts a workload cluster and makes m there
// through p, which knows no cluster: the Node lives where the join data
// points, and p holds no credentials for it. A repair must register the
// Node afresh (a new UID and boot ID, the labels and taints set on the
// old one gone), by a certificate the repair's own token asked for, and
// leave no Node in the management cluster, whose client is mgmt. It
// deletes the instance at the end.
func CheckRepairRegistersAfresh(t *testing.T, mgmt kubernetes.Interface, p NodeNamer, m *machinistv1.Machine, class *machinistv1.MachineClass, wait time.Duration) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	workload, err := StartWorkload()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(workload.Stop()).To(Succeed()) })
	admin := kubernetes.NewForConfigOrDie(workload.Config)
	id, err := p.Create(ctx, m, class, workload.JoinData(t))
	g.Expect(err).NotTo(HaveOccurred())
	name, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	readyNode := func(g Gomega) *corev1.Node {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))))
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
	_, err = mgmt.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Node in the management cluster: %v", err)
	g.Expect(p.Delete(ctx, id)).To(Succeed())
}
