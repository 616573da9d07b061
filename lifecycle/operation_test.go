package lifecycle_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/lifecycle"
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
		op, err = lifecycle.Request(m, typ, opts, machinistv1.SourceAPI, "alice", time.Now())
		Expect(err).NotTo(HaveOccurred())
		return k8s.Status().Update(ctx, m)
	})).To(Succeed())
	return op
}

func operation(m *machinistv1.Machine) *machinistv1.Operation { return m.Status.Operation }

func finished(state machinistv1.OperationState) OmegaMatcher {
	return WithTransform(operation, PointTo(MatchFields(IgnoreExtras, Fields{"State": Equal(state)})))
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
		ns := newNamespace(ctx)
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

	It("reboots without a drain when asked, and leaves a Node cordoned by hand cordoned", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		newClass(ctx, ns, "small", nil)
		log := watchPhases(ctx, ns, "r1")
		m := runMachine(ctx, newMachine(ns, "r1", "small"))
		boot := m.Status.BootID
		n := node(ctx, m.Status.NodeRef.Name)
		patch := client.MergeFrom(n.DeepCopy())
		n.Spec.Unschedulable = true
		Expect(k8s.Patch(ctx, n, patch)).To(Succeed())

		op := request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: "hard", Drain: ptr.To(false)})
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
		ns := newNamespace(ctx)
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
		Expect(log.get()).To(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
			machinistv1.MachineDraining, machinistv1.MachineRepairing, machinistv1.MachineRunning,
		}))
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

	It("refuses a request annotation the Machine's phase does not allow, or that names no verb, and removes it", func(ctx SpecContext) {
		ns := newNamespace(ctx)
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
		ns := newNamespace(ctx)
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		m := runMachine(ctx, newMachine(ns, "t0", "slow"))
		request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{Drain: ptr.To(false)})
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationFailed))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineFailed))
		Expect(m.Status.FailureReason).To(Equal(lifecycle.FailureRebootTimeout))
		Expect(m.Status.Operation.Message).To(ContainSubstring("no Ready Node with a new boot ID"))
	})

	It("fails an operation in flight when its Machine is deleted", func(ctx SpecContext) {
		ns := newNamespace(ctx)
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
