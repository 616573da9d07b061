package qemu_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// realWait bounds a real node's steps: its kubelet took 24–51 s to Ready
// on an idle 2-core host and 87 s beside a busy test package.
const realWait = 5 * time.Minute

// TestARealNodeJoinsAndRunsAPod boots the real node's guest: Kubernetes'
// own kubelet with containerd, in a VM under TCG. The kubelet joins by
// its own TLS bootstrap (one CSR of the kubelet's signer, approved by
// kube-controller-manager), registers the Node under the Machine's name
// and providerID and goes Ready; kube-scheduler binds a pod to it, which
// containerd runs from the sandbox image the guest imported at boot (no
// pull); and delete leaves no VM and no file.
func TestARealNodeJoinsAndRunsAPod(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	showConsoles(t, dir)
	p, err := qemu.New(qemu.Options{
		StateDir:    dir,
		GuestBinary: guestBinary,
		Log:         zap.New(zap.WriteTo(testWriter{t})),
		Node:        qemu.NodeDir(nodeDir),
	})
	g.Expect(err).NotTo(HaveOccurred())
	m := machine("real")
	class := &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{
		Provider:     qemu.Name,
		ProviderSpec: runtime.RawExtension{Raw: []byte(`{"cpus":2,"memory":"1536Mi","guest":"kubelet"}`)},
	}}
	start := time.Now()
	id, err := p.Create(ctx, m, class, env.JoinData(t))
	g.Expect(err).NotTo(HaveOccurred())
	// A failed test leaves no VM behind to slow the tests after it.
	t.Cleanup(func() { _ = p.Delete(context.Background(), id) })
	name, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	var n *corev1.Node
	g.Eventually(func(g Gomega) {
		n, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("the kubelet's Node was Ready %s after Create", time.Since(start).Round(100*time.Millisecond))
	g.Expect(n.Spec.ProviderID).To(Equal(id))
	g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
	g.Expect(n.Status.NodeInfo.ContainerRuntimeVersion).To(HavePrefix("containerd://2.4.2"))
	g.Expect(n.Status.NodeInfo.KernelVersion).To(Equal(strings.TrimPrefix(filepath.Base(qemuKernel(t)), "vmlinuz-")))
	// The kubelet's own bootstrap: one CSR of the kubelet's client
	// signer, for its Node, made with the join data's token.
	g.Expect(csrs(g, name)).To(Equal(1))
	list, err := clientset.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, c := range list.Items {
		block, _ := pem.Decode(c.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		if req.Subject.CommonName == "system:node:"+name {
			g.Expect(c.Spec.SignerName).To(Equal(certificatesv1.KubeAPIServerClientKubeletSignerName))
			g.Expect(c.Spec.Groups).To(ContainElement("system:bootstrappers"))
			g.Expect(c.Status.Conditions).To(ContainElement(HaveField("Type", certificatesv1.CertificateApproved)))
		}
	}

	// A pod, scheduled by kube-scheduler and run by containerd from the
	// image the guest imported: pulling it would fail, for nothing
	// beyond the host is reachable.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "on-a-real-node"},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: name},
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "pause", Image: qemu.SandboxImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	_, err = clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	podStart := time.Now()
	g.Eventually(func(g Gomega) {
		got, err := clientset.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Spec.NodeName).To(Equal(name))
		g.Expect(got.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(got.Status.PodIP).To(HavePrefix("10.88."), "an address of the node's CNI bridge")
		g.Expect(got.Status.ContainerStatuses).To(ConsistOf(And(
			HaveField("Ready", true), HaveField("ContainerID", HavePrefix("containerd://")))))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("the pod was Running %s after it was made", time.Since(podStart).Round(100*time.Millisecond))

	inst, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst.Power).To(Equal(providers.PowerOn))
	g.Expect(inst.BootID).To(Equal(n.Status.NodeInfo.BootID))

	// Delete leaves no VM and no file.
	g.Expect(p.Delete(ctx, id)).To(Succeed())
	g.Expect(vms(id)).To(BeEmpty())
	left, _ := filepath.Glob(filepath.Join(dir, "vm_real_*"))
	g.Expect(left).To(BeEmpty())
}

// TestARealNodeNeedsItsFiles: a class asking for the real node's guest
// of a provider started without its files is refused at Create, saying
// what to build, and so is a real node too small to hold them.
func TestARealNodeNeedsItsFiles(t *testing.T) {
	g := NewWithT(t)
	p, err := qemu.New(qemu.Options{StateDir: t.TempDir(), GuestBinary: guestBinary})
	g.Expect(err).NotTo(HaveOccurred())
	class := func(spec string) *machinistv1.MachineClass {
		return &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{Provider: qemu.Name, ProviderSpec: runtime.RawExtension{Raw: []byte(spec)}}}
	}
	_, err = p.Create(context.Background(), machine("nofiles"), class(`{"memory":"1Gi","guest":"kubelet"}`), env.JoinData(t))
	g.Expect(err).To(MatchError(ContainSubstring("make node")))
	_, err = p.Create(context.Background(), machine("small"), class(`{"memory":"512Mi","guest":"kubelet"}`), env.JoinData(t))
	g.Expect(err).To(MatchError(ContainSubstring("needs at least 1Gi")))
	_, err = p.Create(context.Background(), machine("other"), class(`{"guest":"kubelets"}`), env.JoinData(t))
	g.Expect(err).To(MatchError(ContainSubstring(`guest "kubelets"`)))
}
