package machine_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// setVersion changes the Machine's spec.version, as a person would with
// kubectl edit.
func setVersion(ctx context.Context, m *machinistv1.Machine, version string) {
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.Version = version
	Expect(k8s.Patch(ctx, m, patch)).To(Succeed())
}

var _ = Describe("In-place updates", func() {
	It("updates a Machine whose version changed where it stands: drain, update, the new version and boot ID on the same Node", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		log := watchPhases(ctx, ns, "u0")
		m := runMachine(ctx, newMachine(ns, "u0", "small"))
		boot, nodeName, providerID := m.Status.BootID, m.Status.NodeRef.Name, m.Status.ProviderID
		pod := boundPod(ctx, ns, "app", nodeName, nil, nil)

		setVersion(ctx, m, "v1.38.0")
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		op := m.Status.Operation
		Expect(op.Type).To(Equal(machinistv1.OperationUpdate))
		Expect(op.Source).To(Equal(machinistv1.SourceSpec))
		Expect(op.RequestedBy).To(BeEmpty(), "a version changed by hand names no one")
		Expect(op.FromVersion).To(Equal("v1.37.2"))
		Expect(op.ToVersion).To(Equal("v1.38.0"))
		Expect(op.Message).To(ContainSubstring("v1.37.2 -> v1.38.0"))
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(m.Status.NodeRef.Name).To(Equal(nodeName), "the same Node")
		Expect(m.Status.ProviderID).To(Equal(providerID), "the same instance")
		n := node(ctx, nodeName)
		Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
		Expect(n.Spec.Unschedulable).To(BeFalse(), "uncordoned after the update")
		Expect(podExists(ctx, pod)()).To(BeFalse(), "the drain evicted the pod")
		Expect(log.get()).To(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
			machinistv1.MachineDraining, machinistv1.MachineUpdating, machinistv1.MachineRunning,
		}))
		restarts, err := provider.Restarts(providerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(Equal(1), "updated exactly once")
		Eventually(eventReasons(ctx, m)).Should(ContainElements("OperationRequested", "OperationStarted", "OperationSucceeded"))

		// Settled: the Machine runs its version, so nothing more happens.
		Consistently(func() string { return getMachine(ctx, m)().Status.Operation.ID }).
			WithTimeout(2 * time.Second).Should(Equal(op.ID))
	})

	It("finishes an update across a manager restart without repeating it", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: 3 * time.Second}})
		m := runMachine(ctx, newMachine(ns, "u2", "slow"))
		setVersion(ctx, m, "v1.38.0")
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(WithTransform(phase, Equal(machinistv1.MachineUpdating)))

		Expect(controllers.RestartManager()).To(Succeed())
		// The new manager keeps metrics of its own.
		metrics = controllers.Manager.Metrics

		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(node(ctx, m.Status.NodeRef.Name).Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
		Consistently(func() (int, error) { return provider.Restarts(m.Status.ProviderID) }).
			WithTimeout(2*time.Second).Should(Equal(1), "the restarted manager resumed the update, it did not repeat it")
	})

	It("gives up an update the provider refuses, returns the Machine to service and does not try that version again", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "stale", &inmemorySpec{FailUpdate: "no image for this version"})
		m := runMachine(ctx, newMachine(ns, "u1", "stale"))
		boot := m.Status.BootID

		setVersion(ctx, m, "v1.38.0")
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationFailed))
		m = getMachine(ctx, m)()
		op := m.Status.Operation
		Expect(op.Type).To(Equal(machinistv1.OperationUpdate))
		Expect(op.Message).To(ContainSubstring("no image for this version"))
		Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		Expect(m.Status.BootID).To(Equal(boot))
		Expect(node(ctx, m.Status.NodeRef.Name).Spec.Unschedulable).To(BeFalse(), "back in service")
		Consistently(func() string { return getMachine(ctx, m)().Status.Operation.ID }).
			WithTimeout(2*time.Second).Should(Equal(op.ID), "the failed version is not tried again")
	})
})
