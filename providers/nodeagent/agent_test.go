package nodeagent_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

var (
	env *testenv.Env
	// clientset is an administrator's, to set tests up and observe them;
	// agents never use it.
	clientset kubernetes.Interface
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) {
		env = e
		clientset = kubernetes.NewForConfigOrDie(e.Config)
	}))
}

const (
	renew = 500 * time.Millisecond
	wait  = 20 * time.Second
)

// start runs an agent until the test ends and returns a function that
// crashes it and reports whether Run returned promptly. The agent joins
// first and runs as its Node, as a machine's does, so that what it does
// is judged by the Node authorizer and NodeRestriction.
func start(t *testing.T, cfg nodeagent.Config) (*nodeagent.Agent, func()) {
	t.Helper()
	cfg.Client = env.NodeClient(t, cfg.NodeName)
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = renew
	}
	if cfg.LeaseDurationSeconds == 0 {
		cfg.LeaseDurationSeconds = 3
	}
	agent := nodeagent.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	crashed := false
	crash := func() {
		t.Helper()
		if crashed {
			return
		}
		crashed = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Run did not return within 10s of its context being cancelled")
		}
	}
	t.Cleanup(crash)
	return agent, crash
}

func getNode(g Gomega, name string) *corev1.Node {
	n, err := clientset.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

func renewTime(g Gomega, name string) time.Time {
	l, err := clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l.Spec.RenewTime).NotTo(BeNil())
	return l.Spec.RenewTime.Time
}

func TestRegistersNodeAndRenewsLeaseUntilCrash(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const name = "register-1"
	agent, crash := start(t, nodeagent.Config{
		NodeName:   name,
		ProviderID: "test:///register-1",
		Version:    "v1.37.2",
		Capacity:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")},
	})

	var node *corev1.Node
	g.Eventually(func(g Gomega) {
		node = getNode(g, name)
		g.Expect(readyOf(node)).NotTo(BeNil())
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(node.Spec.ProviderID).To(Equal("test:///register-1"))
	g.Expect(node.Labels).To(HaveKeyWithValue(corev1.LabelHostname, name))
	g.Expect(node.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
	g.Expect(node.Status.NodeInfo.BootID).NotTo(BeEmpty())
	g.Expect(node.Status.NodeInfo.BootID).To(Equal(agent.BootID()))
	g.Expect(readyOf(node).Status).To(Equal(corev1.ConditionTrue))
	g.Expect(readyOf(node).Reason).To(Equal(nodeagent.ReasonReady))
	cpu, mem, pods := node.Status.Capacity[corev1.ResourceCPU], node.Status.Capacity[corev1.ResourceMemory], node.Status.Allocatable[corev1.ResourcePods]
	g.Expect(cpu.String()).To(Equal("8"), "the caller's capacity wins")
	g.Expect(mem.String()).To(Equal("4Gi"), "defaults fill what the caller left out")
	g.Expect(pods.String()).To(Equal("110"))

	// The Lease follows the Node, since it names the Node as its owner.
	var lease *coordinationv1.Lease
	g.Eventually(func() (err error) {
		lease, err = clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		return err
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(*lease.Spec.HolderIdentity).To(Equal(name))
	g.Expect(*lease.Spec.LeaseDurationSeconds).To(Equal(int32(3)))
	g.Expect(lease.OwnerReferences).To(ConsistOf(HaveField("UID", node.UID)))

	first := renewTime(g, name)
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed(), "the lease is renewed")

	// Nothing but the Lease is written while the machine runs.
	g.Consistently(func(g Gomega) string {
		return getNode(g, name).ResourceVersion
	}).WithTimeout(3 * renew).Should(Equal(node.ResourceVersion))

	crash()
	stopped := renewTime(g, name)
	g.Consistently(func(g Gomega) time.Time {
		return renewTime(g, name)
	}).WithTimeout(4*renew).WithPolling(renew/4).Should(Equal(stopped), "a crashed agent renews nothing")
	g.Expect(getNode(g, name).ResourceVersion).To(Equal(node.ResourceVersion), "a crashed agent writes no farewell status")
	g.Expect(time.Since(stopped)).To(BeNumerically(">", 4*renew))
}

// failFirst fails the first request its match accepts with a 500, as a
// kube-apiserver that goes away mid-request would, and passes the rest.
type failFirst struct {
	next   http.RoundTripper
	match  func(*http.Request) bool
	failed atomic.Bool
}

func (f *failFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.match(r) && f.failed.CompareAndSwap(false, true) {
		return &http.Response{
			StatusCode: http.StatusInternalServerError, Status: "500 Internal Server Error", Request: r,
			Header: http.Header{"Content-Type": []string{"text/plain"}},
			Body:   io.NopCloser(strings.NewReader("kube-apiserver is going away")),
		}, nil
	}
	return f.next.RoundTrip(r)
}

// A Lease whose creation failed once is created on the next try and then
// renewed: the failed try must not leave the agent renewing a Lease it
// never got (client-go answers an error with an empty object).
func TestLeaseCreatedAfterAFailedTry(t *testing.T) {
	g := NewWithT(t)
	const name = "lease-retry-1"
	cfg := env.NodeCredentials(t, env.JoinData(t), name).Config()
	fault := &failFirst{match: func(r *http.Request) bool {
		return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/namespaces/kube-node-lease/leases")
	}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { fault.next = rt; return fault })
	flaky, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())

	agent := nodeagent.New(nodeagent.Config{
		Client: flaky, NodeName: name, ProviderID: "test:///" + name, Version: "v1.37.2",
		RenewInterval: renew, LeaseDurationSeconds: 3,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var first time.Time
	g.Eventually(func(g Gomega) { first = renewTime(g, name) }).WithTimeout(wait).Should(Succeed())
	g.Expect(fault.failed.Load()).To(BeTrue(), "the first Lease create was failed")
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed(), "the lease is renewed")
}

func TestNeverReady(t *testing.T) {
	g := NewWithT(t)
	const name = "never-ready-1"
	start(t, nodeagent.Config{NodeName: name, ProviderID: "test:///" + name, Version: "v1.37.2", NeverReady: true})
	g.Eventually(func(g Gomega) {
		r := readyOf(getNode(g, name))
		g.Expect(r).NotTo(BeNil())
		g.Expect(r.Status).To(Equal(corev1.ConditionFalse))
		g.Expect(r.Reason).To(Equal(nodeagent.ReasonNotReady))
	}).WithTimeout(wait).Should(Succeed())
	// A sick kubelet still heartbeats: only readiness is wrong.
	var first time.Time
	g.Eventually(func(g Gomega) { first = renewTime(g, name) }).WithTimeout(wait).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed())
}

func TestRestartKeepsOthersFieldsAndChangesBootID(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const name = "restart-1"
	cfg := nodeagent.Config{NodeName: name, ProviderID: "test:///" + name, Version: "v1.37.2"}
	agent, crash := start(t, cfg)
	g.Eventually(func(g Gomega) { g.Expect(readyOf(getNode(g, name))).NotTo(BeNil()) }).WithTimeout(wait).Should(Succeed())
	oldBoot := getNode(g, name).Status.NodeInfo.BootID

	// The controller's part of the Node: labels, taints, cordon.
	node := getNode(g, name)
	node.Labels["machinist.dev/pool"] = "blue"
	node.Spec.Taints = []corev1.Taint{{Key: "machinist.dev/draining", Effect: corev1.TaintEffectNoSchedule}}
	node.Spec.Unschedulable = true
	_, err := clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	crash()

	// Booting the same agent again is a reboot.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	g.Eventually(func(g Gomega) {
		g.Expect(getNode(g, name).Status.NodeInfo.BootID).NotTo(Equal(oldBoot))
	}).WithTimeout(wait).Should(Succeed())
	node = getNode(g, name)
	g.Expect(node.Status.NodeInfo.BootID).To(Equal(agent.BootID()))
	g.Expect(node.Labels).To(HaveKeyWithValue("machinist.dev/pool", "blue"))
	g.Expect(node.Labels).To(HaveKeyWithValue(corev1.LabelHostname, name))
	g.Expect(node.Spec.Taints).To(ConsistOf(HaveField("Key", "machinist.dev/draining")))
	g.Expect(node.Spec.Unschedulable).To(BeTrue())
	g.Expect(readyOf(node).Status).To(Equal(corev1.ConditionTrue))

	first := renewTime(g, name)
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed(), "the rebooted agent takes its lease back")

	// Running the same agent twice at once would be two kubelets for one Node.
	g.Expect(agent.Run(ctx)).To(MatchError(ContainSubstring("already running")))
}

func newPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:       node,
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
			Containers:     []corev1.Container{{Name: "app", Image: "nginx"}, {Name: "sidecar", Image: "envoy"}},
		},
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Agents run the pods bound to their own Node and finish deleting them,
// and leave everyone else's pods alone.
func TestAgentsRunTheirOwnPodsAlone(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const prefix = "pods"
	nodeA, nodeB := prefix+"-a", prefix+"-b"
	start(t, nodeagent.Config{NodeName: nodeA, ProviderID: "test:///" + nodeA, Version: "v1.37.2"})
	start(t, nodeagent.Config{NodeName: nodeB, ProviderID: "test:///" + nodeB, Version: "v1.37.2"})
	pods := clientset.CoreV1().Pods(metav1.NamespaceDefault)
	for _, p := range []*corev1.Pod{newPod(prefix+"-on-a", nodeA), newPod(prefix+"-on-b", nodeB), newPod(prefix+"-elsewhere", prefix+"-nobody")} {
		_, err := pods.Create(ctx, p, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = pods.Delete(ctx, p.Name, *metav1.NewDeleteOptions(0)) })
	}

	var hostIP string
	g.Eventually(func(g Gomega) {
		for _, a := range getNode(g, nodeA).Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				hostIP = a.Address
			}
		}
		g.Expect(hostIP).NotTo(BeEmpty())
	}).WithTimeout(wait).Should(Succeed())
	g.Eventually(func(g Gomega) {
		p, err := pods.Get(ctx, prefix+"-on-a", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(podReady(p)).To(BeTrue())
		g.Expect(p.Status.PodIP).NotTo(BeEmpty())
		g.Expect(p.Status.HostIP).To(Equal(hostIP))
		for _, ct := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady} {
			g.Expect(p.Status.Conditions).To(ContainElement(And(HaveField("Type", ct), HaveField("Status", corev1.ConditionTrue))))
		}
		g.Expect(p.Status.ContainerStatuses).To(HaveLen(2))
		g.Expect(p.Status.ContainerStatuses).To(HaveEach(HaveField("Ready", true)))
	}).WithTimeout(wait).Should(Succeed())
	g.Eventually(func(g Gomega) {
		p, err := pods.Get(ctx, prefix+"-on-b", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(podReady(p)).To(BeTrue())
	}).WithTimeout(wait).Should(Succeed())
	p, err := pods.Get(ctx, prefix+"-elsewhere", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Status.Phase).To(Equal(corev1.PodPending), "no agent runs that pod's node")

	// A graceful delete only marks the pod; the kubelet must finish it, and
	// well before the 300s grace period runs out.
	g.Expect(pods.Delete(ctx, prefix+"-on-a", *metav1.NewDeleteOptions(300))).To(Succeed())
	g.Eventually(func() bool {
		_, err := pods.Get(ctx, prefix+"-on-a", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(wait).Should(BeTrue())
	g.Expect(pods.Delete(ctx, prefix+"-elsewhere", *metav1.NewDeleteOptions(300))).To(Succeed())
	g.Consistently(func() error {
		_, err := pods.Get(ctx, prefix+"-elsewhere", metav1.GetOptions{})
		return err
	}).WithTimeout(2*time.Second).Should(Succeed(), "nobody finishes a pod whose node has no agent")
}

// A Node marked Ready=Unknown while its kubelet was late (as the node
// lifecycle controller, or the Machine controller, does) is Ready again
// once the kubelet renews: it posts its status after a late renewal.
func TestLateRenewalPostsReadyAgain(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	name := "late-renewal"
	// Every renewal comes after the Lease ran out.
	start(t, nodeagent.Config{NodeName: name, ProviderID: "test:///late", LeaseDurationSeconds: 1, RenewInterval: 1500 * time.Millisecond})
	readyStatus := func(g Gomega) corev1.ConditionStatus {
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status
			}
		}
		return ""
	}
	g.Eventually(readyStatus).WithTimeout(wait).Should(Equal(corev1.ConditionTrue))

	n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionUnknown
			n.Status.Conditions[i].Reason = "NodeStatusUnknown"
		}
	}
	_, err = clientset.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(readyStatus).WithTimeout(wait).Should(Equal(corev1.ConditionTrue))
}

func readyOf(n *corev1.Node) *corev1.NodeCondition { return nodes.Condition(n, corev1.NodeReady) }

// After an outage the node lifecycle controller, catching up, may mark a
// Node Ready=Unknown after its kubelet has already posted its status
// again on the first late renewal. The agent looks again on the renewals
// that follow, as a kubelet's periodic status check would, and posts
// Ready once more; otherwise the Node would stay Unknown, and a health
// check would remediate a healthy machine.
func TestAMarkAfterTheOutageIsPostedOverToo(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	name := "after-outage"
	start(t, nodeagent.Config{NodeName: name, ProviderID: "test:///after-outage", LeaseDurationSeconds: 2})
	ready := func(g Gomega) corev1.ConditionStatus {
		if c := readyOf(getNode(g, name)); c != nil {
			return c.Status
		}
		return ""
	}
	g.Eventually(ready).WithTimeout(wait).Should(Equal(corev1.ConditionTrue))

	g.Expect(env.StopAPIServer()).To(Succeed())
	// On purpose: the Lease runs out while kube-apiserver is down.
	time.Sleep(3 * time.Second)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	g.Expect(env.StartAPIServer(sctx)).To(Succeed())
	back := time.Now()
	g.Eventually(func(g Gomega) time.Time { return renewTime(g, name) }).WithTimeout(wait).Should(BeTemporally(">", back))

	// The mark lands after the first renewal's post.
	n := getNode(g, name)
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionUnknown
			n.Status.Conditions[i].Reason = "NodeStatusUnknown"
		}
	}
	_, err := clientset.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(ready).WithTimeout(5 * time.Second).Should(Equal(corev1.ConditionTrue))
}
