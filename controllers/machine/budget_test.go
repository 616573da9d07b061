package machine_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

var _ = Describe("Disruption budgets", func() {
	It("holds an operation a budget does not allow, pending, and starts it once the budget allows it", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "held", "small"))
		other := runMachine(ctx, newMachine(ns, "other", "small"))
		boot := m.Status.BootID
		budget := &machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "none"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{MaxDisrupted: intstr.FromInt32(0), Selector: machinistv1.LabelSelector{
				MatchExpressions: []machinistv1.LabelSelectorRequirement{{Key: "example.com/nothing", Operator: metav1.LabelSelectorOpDoesNotExist}},
			}},
		}
		Expect(k8s.Create(ctx, budget)).To(Succeed())

		// Asked for by annotation, which no server stands in front of:
		// the Machine controller is where the budget holds it.
		annotate(ctx, m, "reboot")
		Eventually(getMachine(ctx, m)).WithTimeout(10 * time.Second).Should(WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{
			"State":   Equal(machinistv1.OperationPending),
			"Reason":  Equal(machinistv1.ReasonDisruptionHeld),
			"Message": Equal("waiting: MachineDisruptionBudget none allows no more disruptions: 0 of its 2 Machines are disrupted and it allows 0; the reboot of Machine " + ns + "/held waits until one is back"),
		}))))
		Eventually(eventReasons(ctx, m)).Should(ContainElement("DisruptionHeld"))
		Consistently(getMachine(ctx, m)).WithTimeout(3 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineRunning)),
			WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{"State": Equal(machinistv1.OperationPending)}))),
		))
		// One Event for the wait, not one per look.
		Expect(count(eventReasons(ctx, m)(), "DisruptionHeld")).To(Equal(1))

		patch := client.MergeFrom(budget.DeepCopy())
		budget.Spec.MaxDisrupted = intstr.FromInt32(1)
		Expect(k8s.Patch(ctx, budget, patch)).To(Succeed())
		// The budget said to ask again in 10s.
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		Expect(getMachine(ctx, m)().Status.BootID).NotTo(Equal(boot))
		Expect(getMachine(ctx, other)().Status.Operation).To(BeNil())

		// The disruption was recorded in the budget, and is over.
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(budget), budget)).To(Succeed())
			g.Expect(budget.Status.Disruptions).To(BeEmpty())
			g.Expect(budget.Status.DisruptionsAllowed).To(BeEquivalentTo(1))
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})
})

func count(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}
