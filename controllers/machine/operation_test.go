package machine_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/nodes"
)

// annotate asks for a verb through the request annotation.
func annotate(ctx context.Context, m *machinistv1.Machine, verb string) {
	patch := client.MergeFrom(m.DeepCopy())
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[machinistv1.RequestAnnotation] = verb
	Expect(k8s.Patch(ctx, m, patch)).To(Succeed())
}

// request records an operation as the verbs server does, on the stored
// Machine, reading it again if the controller wrote it meanwhile; m is
// left as stored.
func request(ctx context.Context, m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions) *machinistv1.Operation {
	var op *machinistv1.Operation
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		var err error
		op, err = operation.Request(m, typ, opts, machinistv1.SourceAPI, "alice", time.Now())
		Expect(err).NotTo(HaveOccurred())
		return k8s.Status().Update(ctx, m)
	})).To(Succeed())
	return op
}

func operationOf(m *machinistv1.Machine) *machinistv1.Operation { return m.Status.Operation }

func finished(state machinistv1.OperationState) OmegaMatcher {
	return WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{"State": Equal(state)})))
}

// eventReasons lists the reasons of the Events about a Machine.
func eventReasons(ctx context.Context, m *machinistv1.Machine) func() []string {
	return func() []string {
		var list eventsv1.EventList
		Expect(k8s.List(ctx, &list, client.InNamespace(m.Namespace))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Name == m.Name {
				out = append(out, e.Reason)
			}
		}
		return out
	}
}

var _ = Describe("Machine operations", func() {
	It("reboots a Machine asked for by annotation: drain, reboot, a new boot ID, uncordon", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		log := watchPhases(ctx, ns, "r0")
		m := runMachine(ctx, newMachine(ns, "r0", "small"))
		boot := m.Status.BootID
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)

		annotate(ctx, m, "reboot")
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(m.Status.Operation.Type).To(Equal(machinistv1.OperationReboot))
		Expect(m.Status.Operation.Source).To(Equal(machinistv1.SourceAnnotation))
		Expect(m.Status.Operation.StartedAt).NotTo(BeNil())
		Expect(m.Status.Operation.CompletedAt).NotTo(BeNil())
		Expect(m.Status.Operation.Message).To(ContainSubstring(m.Status.BootID))
		Expect(m.Annotations).NotTo(HaveKey(machinistv1.RequestAnnotation))
		Expect(m.Annotations).To(HaveKeyWithValue(machinistv1.LastRequestAnnotation, m.Status.Operation.ID))
		Expect(podExists(ctx, pod)()).To(BeFalse(), "the drain evicted the pod")
		Expect(log.get()).To(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
			machinistv1.MachineDraining, machinistv1.MachineRebooting, machinistv1.MachineRunning,
		}))
		n := node(ctx, m.Status.NodeRef.Name)
		Expect(n.Spec.Unschedulable).To(BeFalse(), "uncordoned after the reboot")
		Expect(n.Status.NodeInfo.BootID).To(Equal(m.Status.BootID))
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(Equal(1))
		Eventually(eventReasons(ctx, m)).Should(ContainElements(
			"OperationRequested", "OperationStarted", "MachineDraining", "MachineRebooting", "OperationSucceeded"))
	})

	It("finishes a reboot whose provider reply was lost after the machine had booted again", func(ctx SpecContext) {
		// Found by the chaos tests: the Node's new boot was seen while the
		// Machine was still Draining, the retried call moved it to
		// Rebooting, and nothing woke it again until the operation timed
		// out and the Machine was Failed.
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "lost", "small"))
		boot := m.Status.BootID
		// The first call reboots; it and the retries that find it done
		// lose their replies until the new boot's Node events are spent.
		provider.LoseNextReplies(4)
		DeferCleanup(func() { provider.LoseNextReplies(0) })
		request(ctx, m, machinistv1.OperationReboot, nil)
		// Well inside the suite's 5s operation timeout.
		Eventually(getMachine(ctx, m)).WithTimeout(4 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(Equal(1), "the retried call did not reboot again")
	})

	It("reboots without a drain when asked, and leaves a Node cordoned by hand cordoned", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		log := watchPhases(ctx, ns, "r1")
		m := runMachine(ctx, newMachine(ns, "r1", "small"))
		boot := m.Status.BootID
		n := node(ctx, m.Status.NodeRef.Name)
		patch := client.MergeFrom(n.DeepCopy())
		n.Spec.Unschedulable = true
		Expect(k8s.Patch(ctx, n, patch)).To(Succeed())

		op := request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true)})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Operation.ID).To(Equal(op.ID))
		Expect(m.Status.Operation.RequestedBy).To(Equal("alice"))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(log.get()).To(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
			machinistv1.MachineRebooting, machinistv1.MachineRunning,
		}), "no Draining without a drain")
		Expect(node(ctx, m.Status.NodeRef.Name).Spec.Unschedulable).To(BeTrue())
	})

	It("repairs a Machine: a Node registered afresh gets the Machine's labels and taints again", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		log := watchPhases(ctx, ns, "p0")
		m := runMachine(ctx, newMachine(ns, "p0", "small"))
		boot, nodeUID := m.Status.BootID, m.Status.NodeRef.UID
		n := node(ctx, m.Status.NodeRef.Name)
		patch := client.MergeFrom(n.DeepCopy())
		n.Labels["by-hand"] = "yes"
		Expect(k8s.Patch(ctx, n, patch)).To(Succeed())

		// A pod to evict makes the drain last past a status write, so
		// that Draining is stored and the watch can show it.
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)
		request(ctx, m, machinistv1.OperationRepair, &machinistv1.OperationOptions{Reason: "disk errors"})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(m.Status.NodeRef.UID).NotTo(Equal(nodeUID), "the Node was registered afresh")
		Expect(m.Status.Operation.Options.Reason).To(Equal("disk errors"))
		Expect(m.Status.LastTransition.Event).To(Equal("repaired"))
		Expect(podExists(ctx, pod)()).To(BeFalse(), "the drain evicted the pod")
		// Provisioning is not stored when the Node is Ready within the
		// reconcile that created the instance.
		Expect(log.get()).To(Or(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
			machinistv1.MachineDraining, machinistv1.MachineRepairing, machinistv1.MachineRunning,
		}), Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineRunning,
			machinistv1.MachineDraining, machinistv1.MachineRepairing, machinistv1.MachineRunning,
		})))
		Eventually(func(g Gomega) {
			n := &corev1.Node{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, n)).To(Succeed())
			g.Expect(n.Labels).To(HaveKeyWithValue("pool", "blue"))
			g.Expect(n.Labels).To(HaveKeyWithValue("machinist.dev/class", "small"))
			g.Expect(n.Labels).NotTo(HaveKey("by-hand"))
			g.Expect(n.Spec.Taints).To(ContainElement(MatchFields(IgnoreExtras, Fields{"Key": Equal("dedicated"), "Value": Equal("batch")})))
			g.Expect(n.Spec.Unschedulable).To(BeFalse())
		}).Should(Succeed())
	})

	It("deletes with a repaired Machine a kept token's Secret its status never recorded", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "k0", "small"))
		request(ctx, m, machinistv1.OperationRepair, nil)
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		// What a kill -9 between the Secret's create and the status
		// write that records it leaves behind.
		kept := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: testenv.ManagerNamespace, Name: "machinist-join-" + string(m.UID)},
			Type:       nodes.KeptTokenSecretType,
		}
		Expect(k8s.Create(ctx, kept)).To(Succeed())
		Expect(k8s.Delete(ctx, getMachine(ctx, m)())).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(kept), &corev1.Secret{}))
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the unrecorded kept token outlived its Machine")
	})

	It("believes no requester annotation while no admission policy vouches for it, and removes it with the request", func(ctx SpecContext) {
		// This suite installs no admission policy: anyone who may patch
		// a Machine could write any name.
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "f0", "small"))
		patch := client.MergeFrom(m.DeepCopy())
		m.Annotations = map[string]string{machinistv1.RequestAnnotation: "reboot", machinistv1.RequestedByAnnotation: "mallory"}
		Expect(k8s.Patch(ctx, m, patch)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Operation.Source).To(Equal(machinistv1.SourceAnnotation))
		Expect(m.Status.Operation.RequestedBy).To(BeEmpty())
		Expect(m.Annotations).NotTo(HaveKey(machinistv1.RequestAnnotation))
		Expect(m.Annotations).NotTo(HaveKey(machinistv1.RequestedByAnnotation))
	})

	It("refuses a request annotation the Machine's phase does not allow, or that names no verb, and removes it", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "stuck", &inmemorySpec{NeverReady: true})
		m := newMachine(ns, "a0", "stuck")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).Should(WithTransform(phase, Equal(machinistv1.MachineProvisioning)))
		m = getMachine(ctx, m)()
		annotate(ctx, m, "reboot")
		Eventually(func() map[string]string { return getMachine(ctx, m)().Annotations }).
			ShouldNot(HaveKey(machinistv1.RequestAnnotation))
		m = getMachine(ctx, m)()
		Expect(m.Status.Operation).To(BeNil())
		Expect(m.Annotations).NotTo(HaveKey(machinistv1.LastRequestAnnotation))

		annotate(ctx, m, "explode")
		Eventually(func() map[string]string { return getMachine(ctx, m)().Annotations }).
			ShouldNot(HaveKey(machinistv1.RequestAnnotation))
		Expect(getMachine(ctx, m)().Status.Operation).To(BeNil())
		Eventually(eventReasons(ctx, m)).Should(ContainElement("OperationRefused"))
	})

	It("fails a reboot whose Machine does not come back in time", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		m := runMachine(ctx, newMachine(ns, "t0", "slow"))
		request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{SkipDrain: ptr.To(true)})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationFailed))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineFailed))
		reason, _ := m.Status.Failure()
		Expect(reason).To(Equal(machinistv1.FailureRebootTimeout))
		Expect(m.Status.Operation.Message).To(ContainSubstring("no Ready Node with a new boot ID"))
	})

	It("fails a reboot whose Machine does not come back within the operation's timeoutSeconds, well before the controller's timeout", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		m := runMachine(ctx, newMachine(ns, "t1", "slow"))
		op := request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{TimeoutSeconds: ptr.To(int64(1))})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationFailed))
		m = getMachine(ctx, m)()
		msg := "no Ready Node with a new boot ID 1s after the reboot began"
		Expect(m.Status).To(MatchFields(IgnoreExtras, Fields{
			"Phase":          Equal(machinistv1.MachineFailed),
			"LastTransition": PointTo(MatchFields(IgnoreExtras, Fields{"From": Equal(machinistv1.MachineRebooting), "Event": Equal("fail")})),
			"Operation":      PointTo(MatchFields(IgnoreExtras, Fields{"ID": Equal(op.ID), "Message": Equal(msg)})),
		}))
		reason, message := m.Status.Failure()
		Expect(reason).To(Equal(machinistv1.FailureRebootTimeout))
		Expect(message).To(Equal(msg))
		// The suite's operation timeout is 5s from entering Rebooting, after
		// startedAt: ignoring timeoutSeconds would take 5s or more. Stored
		// times have whole seconds and the deadline counts from the stored
		// startedAt, so 1s is exact at the low end.
		took := m.Status.LastTransition.Time.Sub(m.Status.Operation.StartedAt.Time)
		Expect(took).To(And(BeNumerically(">=", time.Second), BeNumerically("<", 5*time.Second)))
	})

	It("deletes the pods of a dead boot after a hard reboot without a drain of an unreachable Node", func(ctx SpecContext) {
		ns, other := env.NewNamespace(GinkgoTB(), "lifecycle"), env.NewNamespace(GinkgoTB(), "lifecycle")
		// The machine stays off a second after the reboot, as a real one
		// would, so that the Node the controller judges is the dead boot's.
		newClass(ctx, ns, "small", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Second}})
		h := observe(ctx, ns)
		m := runMachine(ctx, newMachine(ns, "dead", "small"))
		boot, nodeName := m.Status.BootID, m.Status.NodeRef.Name
		pod := boundPod(ctx, ns, "app", nodeName, nil, nil)
		elsewhere := boundPod(ctx, other, "app", nodeName, nil, nil)
		onAnotherNode := boundPod(ctx, ns, "other-node", "no-such-node", nil, nil)
		mirror := mirrorPod(ctx, ns, node(ctx, nodeName))
		Eventually(podPhase(ctx, pod)).Should(Equal(corev1.PodRunning), "the node agent runs bound pods")

		By("crashing the machine until its Lease expires")
		Expect(provider.Crash(m.Status.ProviderID)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(
			WithTransform(condition(machinistv1.ConditionNodeHealthy), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status": Equal(metav1.ConditionFalse), "Reason": Equal("NodeLeaseExpired"),
			}))))
		Expect(podPhase(ctx, pod)()).To(Equal(corev1.PodRunning), "no kubelet is left to say otherwise")

		op := request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true)})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Operation.ID).To(Equal(op.ID))
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(h.phasesSinceRunning("dead")()).To(Equal([]machinistv1.MachinePhase{running, rebooting, running}),
			"no drain")

		By("deleting every pod bound to the Node but its mirror pod, and saying so")
		Expect(podExists(ctx, pod)()).To(BeFalse())
		Expect(podExists(ctx, elsewhere)()).To(BeFalse(), "pods of every namespace")
		Expect(podExists(ctx, mirror)()).To(BeTrue(), "a mirror pod is the kubelet's to recreate")
		Expect(podExists(ctx, onAnotherNode)()).To(BeTrue(), "only that Node's pods")
		Eventually(h.eventsOf("dead")).Should(ContainElement(
			HavePrefix(fmt.Sprintf("Normal PodsOfDeadBootDeleted: deleted 2 pod(s) of node %s that died with its unreachable boot (Node %s's kubelet has not renewed its Lease",
				nodeName, nodeName))))
	})

	It("leaves a healthy Node's pods alone on a hard reboot without a drain", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Second}})
		h := observe(ctx, ns)
		m := runMachine(ctx, newMachine(ns, "alive", "small"))
		boot := m.Status.BootID
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)
		Eventually(podPhase(ctx, pod)).Should(Equal(corev1.PodRunning), "the node agent runs bound pods")

		request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true)})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		Expect(getMachine(ctx, m)().Status.BootID).NotTo(Equal(boot))
		// The pods would have gone before Rebooting was stored, so long
		// before the operation succeeded.
		kept := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), kept)).To(Succeed())
		Expect(kept.UID).To(Equal(pod.UID))
		Expect(kept.DeletionTimestamp).To(BeNil())
		Eventually(h.eventsOf("alive")).Should(ContainElement(HavePrefix("Normal OperationSucceeded:")))
		Expect(h.eventsOf("alive")()).NotTo(ContainElement(ContainSubstring("PodsOfDeadBootDeleted")))
	})

	It("fails an operation in flight when its Machine is deleted", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		m := runMachine(ctx, newMachine(ns, "d0", "slow"))
		request(ctx, m, machinistv1.OperationReboot, nil)
		Eventually(getMachine(ctx, m)).Should(WithTransform(phase, Equal(machinistv1.MachineRebooting)))
		Expect(k8s.Delete(ctx, m)).To(Succeed())
		// Deleting can finish in the same reconcile, leaving no status to
		// store the outcome in: the Event is the record.
		Eventually(eventReasons(ctx, m)).WithTimeout(30 * time.Second).Should(ContainElement("OperationFailed"))
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}) }).
			WithTimeout(30 * time.Second).ShouldNot(Succeed())
	})
})

// podPhase reads pod's phase as stored.
func podPhase(ctx context.Context, pod *corev1.Pod) func() corev1.PodPhase {
	return func() corev1.PodPhase {
		p := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), p)).To(Succeed())
		return p.Status.Phase
	}
}

// mirrorPod creates the API's copy of a static pod on n, as its kubelet
// would: the mirror annotation and the Node as owner.
func mirrorPod(ctx context.Context, ns string, n *corev1.Node) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "static-" + n.Name,
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "mirror"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:   n.Name,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/static:1"}},
		},
	}
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	return pod
}
