package machine_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

var _ = Describe("A reboot completed on the provider's word", func() {
	// The record a reboot leaves when it completed while the Machine's
	// cluster could not be reached: the provider's boot ID, and
	// BootConfirmed Unknown until the Node is seen.
	unseen := func(sctx SpecContext, m *machinistv1.Machine, before, providers string) {
		now := metav1.Now()
		m.Status.BootID = providers
		m.Status.Operation = &machinistv1.Operation{
			Type: machinistv1.OperationReboot, ID: "reboot-unseen", State: machinistv1.OperationSucceeded,
			Source: machinistv1.SourceAPI, RequestedAt: &now, StartedAt: &now, CompletedAt: &now,
			BootID: before, ProviderBootID: providers, Message: "rebooted on the provider's word",
		}
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionBootConfirmed, Status: metav1.ConditionUnknown, Reason: machinistv1.ReasonNodeNotSeen,
			Message: "the provider reported a boot; the Node's is checked once its cluster answers",
		})
		Expect(k8s.Status().Update(sctx, m)).To(Succeed())
	}

	It("is confirmed when the Node comes back on the provider's boot", func(sctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(sctx, ns, "small", nil)
		m := runMachine(sctx, newMachine(ns, "told", "small"))
		unseen(sctx, m, "the-boot-before", m.Status.BootID)
		Eventually(getMachine(sctx, m)).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(
			WithTransform(condition(machinistv1.ConditionBootConfirmed), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status": Equal(metav1.ConditionTrue), "Reason": Equal(machinistv1.ReasonBootIDMatches),
			}))))
		Expect(eventReasons(sctx, m)()).NotTo(ContainElement(machinistv1.ReasonBootIDMismatch))
	})

	It("says so, with a condition and a Warning Event, when the Node comes back on another boot", func(sctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(sctx, ns, "small", nil)
		m := runMachine(sctx, newMachine(ns, "misled", "small"))
		boot := m.Status.BootID
		unseen(sctx, m, "the-boot-before", "a-boot-that-never-was")
		Eventually(getMachine(sctx, m)).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(
			WithTransform(condition(machinistv1.ConditionBootConfirmed), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status":  Equal(metav1.ConditionFalse),
				"Reason":  Equal(machinistv1.ReasonBootIDMismatch),
				"Message": And(ContainSubstring("a-boot-that-never-was"), ContainSubstring(boot)),
			}))))
		Eventually(eventReasons(sctx, m)).Should(ContainElement(machinistv1.ReasonBootIDMismatch))
		// The Machine records the boot its Node reports.
		Expect(getMachine(sctx, m)().Status.BootID).To(Equal(boot))
	})

	It("waits while the Node still shows the boot before the reboot", func(sctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(sctx, ns, "small", nil)
		m := runMachine(sctx, newMachine(ns, "stale", "small"))
		boot := m.Status.BootID
		unseen(sctx, m, boot, "the-providers-boot")
		Consistently(getMachine(sctx, m)).WithTimeout(2 * leaseSeconds * time.Second).Should(And(
			WithTransform(condition(machinistv1.ConditionBootConfirmed), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status": Equal(metav1.ConditionUnknown),
			}))),
			// What the Machine records of its boot stays the provider's.
			WithTransform(func(m *machinistv1.Machine) string { return m.Status.BootID }, Equal("the-providers-boot")),
		))
	})
})
