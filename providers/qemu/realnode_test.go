package qemu_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// realWait bounds a real node's steps: its kubelet took 24–51 s to Ready
// on an idle 2-core host and 87 s beside a busy test package.
const realWait = 5 * time.Minute

// journalCommit bounds how long ext4, the guest disk's filesystem, takes
// to commit a change that was not synced: twice its default commit
// interval.
const journalCommit = 10 * time.Second

// markerImage is the tests' container (hack/nodeimages/marker): it logs,
// echoes what it is given under exec, and logs the SIGTERM it is stopped
// with.
const markerImage = "machinist.dev/marker:1"

// TestARealNodeUnderTheControllers boots the real node's guest for a
// Machine under the controllers: Kubernetes' own kubelet with containerd,
// in a VM under TCG, of the minor before the control plane's. The kubelet joins by its own TLS bootstrap (one CSR
// of the kubelet's signer, approved by kube-controller-manager) and
// registers the Node under the Machine's name and providerID; the Machine
// controller gives the Node the provider's address, the host's loopback
// where QEMU forwards the kubelet's port, and lifts its uninitialized
// taint, as a cloud controller manager would. kube-scheduler binds a pod
// to it, which containerd runs from images the guest imported at boot (no
// pull); kube-apiserver reaches the kubelet for the pod's logs and an
// exec; a soft reboot gives the pod its grace and a hard one none; the
// pod's delete stops its container with SIGTERM; a repair joins again by
// a new CSR and registers the Node afresh; an update in place boots the
// kubelet of the next minor on the same Node and disk (one of a version
// the provider has no kubelet of is refused, and the machine runs on);
// and the Machine's delete leaves no VM and no file.
func TestARealNodeUnderTheControllers(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := startRealNodes(t, manager.Options{})

	ns := env.NewNamespace(t, "real")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "real-node"},
		Spec: machinistv1.MachineClassSpec{Provider: qemu.Name,
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"cpus":2,"memory":"1536Mi","guest":"kubelet"}`)}},
	}
	g.Expect(env.Client.Create(ctx, class)).To(Succeed())
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "real"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class.Name}, Version: testenv.PreviousVersion},
	}
	start := time.Now()
	g.Expect(env.Client.Create(ctx, m)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		g.Expect(meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)).To(BeTrue())
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("the Machine was Running on a Ready Node %s after it was made", time.Since(start).Round(100*time.Millisecond))
	id, name := m.Status.ProviderID, m.Status.NodeRef.Name
	n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n.Spec.ProviderID).To(Equal(id))
	g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal(testenv.PreviousVersion))
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

	// Initialized as a cloud provider initializes a Node: the address
	// kube-apiserver reaches the kubelet at, and no uninitialized taint.
	inst, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst.Power).To(Equal(providers.PowerOn))
	g.Expect(inst.BootID).To(Equal(n.Status.NodeInfo.BootID))
	g.Expect(inst.Addresses).To(Equal([]corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}))
	g.Eventually(func(g Gomega) {
		n, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Status.Addresses).To(Equal(inst.Addresses))
		g.Expect(n.Spec.Taints).NotTo(ContainElement(HaveField("Key", nodes.Uninitialized)))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	// The kubelet's port, on the host's loopback alone.
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	g.Expect(port).To(BeNumerically(">", 0))
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "the kubelet's port on the host's loopback")
	_ = conn.Close()
	g.Expect(qemuArgs(g, id)).To(ContainSubstring(fmt.Sprintf("hostfwd=tcp:127.0.0.1:%d-:%d", port, port)))

	// A pod, scheduled by kube-scheduler and run by containerd from the
	// images the guest imported: pulling them would fail, for nothing
	// beyond the host is reachable.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "on-a-real-node"},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: name},
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers: []corev1.Container{{
				Name: "marker", Image: markerImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	_, err = clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	podStart := time.Now()
	g.Eventually(func(g Gomega) {
		got, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Spec.NodeName).To(Equal(name))
		g.Expect(got.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(got.Status.PodIP).To(HavePrefix("10.88."), "an address of the node's CNI bridge")
		g.Expect(got.Status.ContainerStatuses).To(ConsistOf(And(
			HaveField("Ready", true), HaveField("ContainerID", HavePrefix("containerd://")))))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("the pod was Running %s after it was made", time.Since(podStart).Round(100*time.Millisecond))

	// kubectl logs: kube-apiserver reads them from the kubelet, which
	// authenticates it by its client certificate and authorizes it
	// through kube-apiserver.
	g.Eventually(func(g Gomega) {
		g.Expect(logsOf(g, ns, pod.Name, false)).To(HavePrefix("marker: started in on-a-real-node\n"))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	// kubectl exec, as kubectl makes it: a websocket, SPDY if refused.
	out := exec(g, ns, pod.Name, "/app", "echo", "hello", "from", "exec")
	g.Expect(out).To(Equal("hello from exec\n"))

	// A soft reboot, without a drain, stops the kubelet and then the
	// pod's container with SIGTERM and its grace, as graceful node
	// shutdown would: its termination message and its last words are
	// there when the kubelet runs it again on the new boot. A hard one
	// gives it none.
	for _, mode := range []machinistv1.RebootMode{machinistv1.RebootSoft, machinistv1.RebootHard} {
		before := containerStatus(g, ns, pod.Name)
		if mode == machinistv1.RebootHard {
			// containerd records a container's start by a rename it
			// does not sync, and ext4 commits it within 5 s: a power
			// cut sooner leaves the container recorded as never
			// started, and the kubelet shows no end for it.
			g.Expect(before.State.Running).NotTo(BeNil())
			time.Sleep(time.Until(before.State.Running.StartedAt.Add(journalCommit)))
		}
		reboot := time.Now()
		operate(g, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: mode, SkipDrain: ptr.To(true)})
		var st corev1.ContainerStatus
		g.Eventually(func(g Gomega) {
			st = containerStatus(g, ns, pod.Name)
			g.Expect(st.RestartCount).To(BeNumerically(">", before.RestartCount))
			g.Expect(st.Ready).To(BeTrue())
		}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
		t.Logf("%s reboot: the pod ran again %s after it was asked for", mode, time.Since(reboot).Round(100*time.Millisecond))
		if mode == machinistv1.RebootSoft {
			g.Expect(st.LastTerminationState.Terminated).NotTo(BeNil())
			g.Expect(st.LastTerminationState.Terminated.Message).To(Equal("marker: stopped on terminated\n"))
			g.Expect(st.LastTerminationState.Terminated.ExitCode).To(BeZero())
			g.Expect(logsOf(g, ns, pod.Name, true)).To(HaveSuffix("marker: terminated received, stopping\n"))
			continue
		}
		// Killed with its VM: it ended with no message and without its
		// last words, and the kubelet knows it ended.
		last := st.LastTerminationState.Terminated
		g.Expect(last).NotTo(BeNil(), "the kubelet lost the container killed with its VM")
		g.Expect(last.ContainerID).To(Equal(before.ContainerID))
		g.Expect(last.Message).To(BeEmpty())
		// Its log is written unsynced and may be lost with the VM.
		if previous, err := clientset.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Previous: true}).DoRaw(ctx); err == nil {
			g.Expect(string(previous)).NotTo(ContainSubstring("received"))
		}
	}

	// The pod's delete: the kubelet stops the container with SIGTERM
	// and gives it its grace, and it logs so before it ends. Followed,
	// so that the line shows before the pod is gone.
	logs, err := clientset.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer logs.Close()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(logs)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	g.Eventually(lines).WithTimeout(time.Minute).Should(Receive(HavePrefix("marker: started in on-a-real-node")))
	g.Expect(clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(lines).WithTimeout(time.Minute).Should(Receive(Equal("marker: terminated received, stopping")))
	g.Eventually(func(g Gomega) {
		_, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	// A repair: a fresh disk, so the kubelet joins again by a CSR of its
	// own with the repair's join data, and its Node registers afresh,
	// without what was put on the old one, and is initialized again.
	before, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	before.Labels["team"] = "left-on-the-old-node"
	_, err = clientset.CoreV1().Nodes().Update(ctx, before, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	operate(g, m, machinistv1.OperationRepair, &machinistv1.OperationOptions{SkipDrain: ptr.To(true)})
	g.Eventually(func(g Gomega) {
		n, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.UID).NotTo(Equal(before.UID), "the Node registered afresh")
		g.Expect(n.Labels).NotTo(HaveKey("team"))
		g.Expect(n.Spec.ProviderID).To(Equal(id))
		g.Expect(n.Status.NodeInfo.MachineID).NotTo(Equal(before.Status.NodeInfo.MachineID), "the disk was wiped")
		g.Expect(n.Status.Addresses).To(Equal(inst.Addresses))
		g.Expect(n.Spec.Taints).NotTo(ContainElement(HaveField("Key", nodes.Uninitialized)))
		g.Expect(nodes.Ready(n)).To(BeTrue())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(csrs(g, name)).To(Equal(2), "one CSR for each disk")

	// An update to a version whose kubelet the provider was not given is
	// refused before the machine is stopped: it runs on, as it was.
	err = p.Update(ctx, id, providers.Operation{ID: "unknown-version", Version: "v1.38.0"})
	g.Expect(err).To(MatchError(ContainSubstring(`the Machine asks for "v1.38.0"`)))
	g.Expect(providers.IsPermanent(err)).To(BeTrue())
	inst, err = p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst.Power).To(Equal(providers.PowerOn))
	g.Expect(inst.BootID).To(Equal(n.Status.NodeInfo.BootID))

	// An update in place boots the new version's kubelet on the same
	// disk: the same Node, with its credentials, now of the new version.
	before = n
	updated := time.Now()
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		m.Spec.Version = testenv.Version
		return env.Client.Update(ctx, m)
	})).To(Succeed())
	succeeded(g, m, func(op *machinistv1.Operation) bool { return op.Type == machinistv1.OperationUpdate })
	g.Eventually(func(g Gomega) {
		n, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal(testenv.Version))
		g.Expect(nodes.Ready(n)).To(BeTrue())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("the update in place to the kubelet of %s took %s", testenv.Version, time.Since(updated).Round(100*time.Millisecond))
	g.Expect(n.UID).To(Equal(before.UID), "the same Node")
	g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(before.Status.NodeInfo.BootID))
	g.Expect(n.Status.NodeInfo.MachineID).To(Equal(before.Status.NodeInfo.MachineID), "the same disk")
	g.Expect(csrs(g, name)).To(Equal(2), "no new join: the kubelet kept its credentials")

	// The Machine's delete leaves no VM, no file and no Node.
	g.Expect(env.Client.Delete(ctx, m)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
		_, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	g.Expect(vms(id)).To(BeEmpty())
	left, _ := filepath.Glob(filepath.Join(dir, ns+"_real_*"))
	g.Expect(left).To(BeEmpty())
}

// logsOf is the log of the pod's only container, or of its run before
// the last with previous, as kubectl logs [--previous] reads it.
func logsOf(g Gomega, ns, pod string, previous bool) string {
	raw, err := clientset.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Previous: previous}).DoRaw(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	return string(raw)
}

// containerStatus is the status of the pod's only container.
func containerStatus(g Gomega, ns, pod string) corev1.ContainerStatus {
	got, err := clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Status.ContainerStatuses).To(HaveLen(1))
	return got.Status.ContainerStatuses[0]
}

// operate asks for an operation on m as the verbs server would, and
// waits until it has succeeded.
func operate(g Gomega, m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions) {
	ctx := context.Background()
	var op *machinistv1.Operation
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		var err error
		if op, err = operation.Request(m, typ, opts, machinistv1.SourceAPI, "alice", time.Now()); err != nil {
			return err
		}
		return env.Client.Status().Update(ctx, m)
	})).To(Succeed())
	succeeded(g, m, func(o *machinistv1.Operation) bool { return o.ID == op.ID })
}

// succeeded waits until m's operation is one ours picks, and has
// succeeded.
func succeeded(g Gomega, m *machinistv1.Machine, ours func(*machinistv1.Operation) bool) {
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(context.Background(), client.ObjectKeyFromObject(m), m)).To(Succeed())
		op := m.Status.Operation
		g.Expect(op).NotTo(BeNil())
		g.Expect(ours(op)).To(BeTrue(), "the Machine's operation is %s %s", op.Type, op.ID)
		g.Expect(op.State).NotTo(Equal(machinistv1.OperationFailed), op.Message)
		g.Expect(op.State).To(Equal(machinistv1.OperationSucceeded))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
}

// exec runs command in the pod's only container through kube-apiserver,
// as kubectl exec does, and returns what it printed.
func exec(g Gomega, ns, pod string, command ...string) string {
	req := clientset.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(env.Config, "GET", req.URL().String())
	g.Expect(err).NotTo(HaveOccurred())
	spdy, err := remotecommand.NewSPDYExecutor(env.Config, "POST", req.URL())
	g.Expect(err).NotTo(HaveOccurred())
	executor, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	g.Expect(err).NotTo(HaveOccurred())
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g.Expect(executor.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})).To(Succeed(), stderr.String())
	return stdout.String()
}

// qemuArgs is the command line of the QEMU process of the instance.
func qemuArgs(g Gomega, providerID string) string {
	pids := vms(providerID)
	g.Expect(pids).To(HaveLen(1))
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	g.Expect(err).NotTo(HaveOccurred())
	return strings.ReplaceAll(string(raw), "\x00", " ")
}

// TestARealNodeNeedsItsFiles: a class asking for the real node's guest
// of a provider started without its files is refused at Create, saying
// what to build, and so is a real node too small to hold them, or asked
// for a version its kubelet is not.
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

	// A real node runs a kubelet of its files: a Machine of another
	// version is refused for good, rather than left waiting for a Node
	// that never reports it, and no VM is left. A file among the other
	// kubelets that is none is named, and costs the rest nothing.
	kubelets := t.TempDir()
	g.Expect(os.Symlink(filepath.Join(nodeDir, "kubelets", "kubelet-"+testenv.PreviousVersion), filepath.Join(kubelets, "old"))).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(kubelets, "junk"), []byte("#!/bin/sh\necho hello\n"), 0o755)).To(Succeed())
	files := qemu.NodeDir(nodeDir)
	files.Kubelets = kubelets
	withFiles, err := qemu.New(qemu.Options{StateDir: t.TempDir(), GuestBinary: guestBinary, Node: files})
	g.Expect(err).NotTo(HaveOccurred())
	newer := machine("newer")
	newer.Spec.Version = "v1.38.0"
	id, err := withFiles.Create(context.Background(), newer, class(`{"memory":"1536Mi","guest":"kubelet"}`), env.JoinData(t))
	g.Expect(err).To(MatchError(And(
		ContainSubstring(`(it holds `+testenv.PreviousVersion+", "+testenv.Version+`), and the Machine asks for "v1.38.0"`),
		ContainSubstring(filepath.Join(kubelets, "junk")+` --version printed "hello\n"`))))
	g.Expect(providers.IsPermanent(err)).To(BeTrue())
	if id != "" {
		g.Expect(vms(id)).To(BeEmpty())
	}
}

// startRealNodes starts a qemu provider of real nodes, in a directory of
// the test's, and the controllers with it and opts (with the tests' quick
// backoff and drain poll), all stopped when the test ends. It returns
// the provider and its directory.
func startRealNodes(t *testing.T, opts manager.Options) (*process.Provider, string) {
	t.Helper()
	g := NewWithT(t)
	ctrllog.SetLogger(logr.Discard())
	dir := t.TempDir()
	showConsoles(t, dir)
	p, err := qemu.New(qemu.Options{
		StateDir:    dir,
		GuestBinary: guestBinary,
		Log:         zap.New(zap.WriteTo(testWriter{t})),
		Node:        qemu.NodeDir(nodeDir),
		// The kubelets renew every 2.5 s, well inside the package's 15 s
		// grace (Kubernetes' 40 s Lease renews every 10 s).
		LeaseDurationSeconds: leaseSeconds,
	})
	g.Expect(err).NotTo(HaveOccurred())
	registry := providers.NewRegistry()
	g.Expect(registry.Register(qemu.Name, p)).To(Succeed())
	opts.Actuators = registry
	opts.Backoff = machinecontroller.Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second}
	opts.DrainPoll = time.Second
	ctrls, err := env.StartControllers(opts, testenv.Leases{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if err := ctrls.Stop(); err != nil {
			t.Error(err)
		}
		// A failed test leaves no VM behind to slow the tests after it.
		_ = p.Stop(context.Background())
	})
	return p, dir
}
