package nodeagent_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// A machine of a workload cluster, booted as `machinist agent
// --bootstrap-kubeconfig` boots it: a repair (its credentials wiped, new
// join data) gives a Node registered afresh by the machine itself, with
// nothing any credentials but its own new ones; a reboot keeps the Node.
func TestARepairedMachineRegistersAfreshWithItsOwnNewCredentials(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	workload, err := testenv.StartWorkload()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(workload.Stop()).To(Succeed()) })
	admin := kubernetes.NewForConfigOrDie(workload.Config)

	const name, providerID = "afresh", "test:///afresh"
	dir := t.TempDir()
	bootstrapPath, kubeconfigPath := filepath.Join(dir, "bootstrap-kubeconfig"), filepath.Join(dir, "kubeconfig")
	// boot joins with what is on the machine's disk, as the agent command
	// does, runs the agent on the credentials that gives, and returns them.
	boot := func() (nodeagent.Credentials, func()) {
		t.Helper()
		joinCtx, cancel := context.WithTimeout(ctx, joinWait)
		defer cancel()
		creds, err := nodeagent.Bootstrap(joinCtx, bootstrapPath, kubeconfigPath, name, providerID, nil)
		g.Expect(err).NotTo(HaveOccurred())
		kube, err := kubernetes.NewForConfig(creds.Config())
		g.Expect(err).NotTo(HaveOccurred())
		agent := nodeagent.New(nodeagent.Config{Client: kube, NodeName: name, ProviderID: providerID, Version: "v1.37.2",
			RenewInterval: renew, LeaseDurationSeconds: 3})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(runCtx) }()
		g.Eventually(func(g Gomega) {
			n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n.Status.NodeInfo.BootID).To(Equal(agent.BootID()))
			g.Expect(readyOf(n)).To(HaveField("Status", corev1.ConditionTrue))
		}).WithTimeout(wait).Should(Succeed())
		var once sync.Once
		halt := func() { once.Do(func() { stop(); g.Expect(<-done).To(Succeed()) }) }
		t.Cleanup(halt)
		return creds, halt
	}
	// repair wipes the machine's disk but for new join data.
	repair := func() {
		t.Helper()
		j := workload.JoinData(t)
		if err := os.Remove(kubeconfigPath); !errors.Is(err, fs.ErrNotExist) {
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(nodeagent.WriteBootstrapKubeconfig(bootstrapPath, j)).To(Succeed())
	}
	// others' puts on the Node what a person and a controller might.
	others := func() *corev1.Node {
		t.Helper()
		patch := `{"metadata":{"labels":{"team":"a","node-role.kubernetes.io/gpu":""},"annotations":{"note":"by hand"}},` +
			`"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`
		n, err := admin.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	lease := func() *metav1.OwnerReference {
		l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.OwnerReferences).To(HaveLen(1))
		return &l.OwnerReferences[0]
	}

	// A first boot has no earlier life to forget, and is refused nothing
	// for looking: a delete answered 404 per new machine is a refused
	// write a rollout of thousands would count.
	before, err := testenv.ReadWrites(ctx, admin)
	g.Expect(err).NotTo(HaveOccurred())
	repair()
	first, stop := boot()
	after, err := testenv.ReadWrites(ctx, admin)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Refused.Since(before.Refused)).NotTo(HaveKey("leases"), "a first boot's refused writes")
	old := others()

	// Why the node deletes its Node rather than clean it: NodeRestriction
	// lets a node change neither its taints nor kubernetes.io labels.
	mine, err := kubernetes.NewForConfig(first.Config())
	g.Expect(err).NotTo(HaveOccurred())
	untainted := old.DeepCopy()
	untainted.Spec.Taints = nil
	_, err = mine.CoreV1().Nodes().Update(ctx, untainted, metav1.UpdateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a node removing its own taint: want 403, got %v", err)
	unlabelled := old.DeepCopy()
	delete(unlabelled.Labels, "node-role.kubernetes.io/gpu")
	_, err = mine.CoreV1().Nodes().Update(ctx, unlabelled, metav1.UpdateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a node removing its own role label: want 403, got %v", err)

	// A reboot keeps the machine's credentials, and with them its Node.
	stop()
	again, stop := boot()
	g.Expect(again.CertPEM).To(Equal(first.CertPEM))
	rebooted, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rebooted.UID).To(Equal(old.UID))
	g.Expect(rebooted.Spec.Taints).To(ContainElement(HaveField("Key", "dedicated")))
	g.Expect(rebooted.Labels).To(HaveKey("team"))

	// A repair: new credentials, and a Node of their own.
	stop()
	repair()
	second, stop := boot()
	g.Expect(second.CertPEM).NotTo(Equal(first.CertPEM))
	user, err := whoAmI(ctx, second.Config())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(user.Username).To(Equal("system:node:" + name))
	fresh, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fresh.UID).NotTo(Equal(old.UID), "registered afresh")
	g.Expect(fresh.Spec.ProviderID).To(Equal(providerID))
	// kube-controller-manager's own taints (not-ready, while the new
	// Node's first status is judged) may come and go; others' are gone.
	g.Expect(fresh.Spec.Taints).NotTo(ContainElement(HaveField("Key", "dedicated")))
	g.Expect(fresh.Labels).NotTo(Or(HaveKey("team"), HaveKey("node-role.kubernetes.io/gpu")))
	g.Expect(fresh.Labels).To(HaveKeyWithValue(nodeagent.LabelHostname, name))
	g.Expect(fresh.Annotations).NotTo(HaveKey("note"))
	g.Expect(lease().UID).To(Equal(fresh.UID), "the Lease is the new Node's")
	_, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing happened in the management cluster: %v", err)

	// A cluster that does not grant nodes the delete: the repaired
	// machine still boots, on its old Node, keeping what others put there.
	others()
	kept, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admin.RbacV1().ClusterRoleBindings().Delete(ctx, bootstrap.RoleNodeRegisterAfresh, metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() bool {
		err := mine.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err)
	}).WithTimeout(wait).Should(BeTrue(), "the authorizer sees the binding gone")
	stop()
	repair()
	boot()
	refused, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(refused.UID).To(Equal(kept.UID))
	g.Expect(refused.Spec.Taints).To(ContainElement(HaveField("Key", "dedicated")))
	g.Expect(refused.Labels).To(HaveKey("team"))
}
