package machine_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// machineReconciles reads the Machine controller's reconciles so far from
// the manager's own metrics.
func machineReconciles() float64 {
	n, err := testenv.ControllerCounter("controller_runtime_reconcile_total", "machine")
	Expect(err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("Lease renewals", func() {
	It("wake no Machine: a settled Machine is looked at again only when its Lease expires", func(ctx SpecContext) {
		const n = 20
		ns := env.NewNamespace(GinkgoTB(), "renewals")
		newClass(ctx, ns, "small", nil)
		machines := make([]*machinistv1.Machine, n)
		for i := range machines {
			machines[i] = newMachine(ns, fmt.Sprintf("m%d", i), "small")
			Expect(k8s.Create(ctx, machines[i])).To(Succeed())
		}
		healthy := WithTransform(condition(machinistv1.ConditionNodeHealthy), PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionTrue),
		})))
		for _, m := range machines {
			Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(And(
				WithTransform(phase, Equal(machinistv1.MachineRunning)), healthy))
		}
		// Whatever their last writes woke has run by then.
		time.Sleep(leaseSeconds * time.Second)

		// Three Lease durations, in which each agent renews 18 times (the
		// suite renews every 500ms). A Machine that asked to be looked at
		// one second after its Lease would expire was reconciled every
		// 3.5 to 4 s: some 50 times for these 20.
		before := machineReconciles()
		time.Sleep(3 * leaseSeconds * time.Second)
		looks := machineReconciles() - before
		Expect(looks).To(BeNumerically("<", n), "Machine reconciles over %d renewals of %d Leases", 18*n, n)
		for _, m := range machines {
			Expect(getMachine(ctx, m)()).To(healthy)
		}
	})

	It("sets its timers again after a restart, from the Leases it lists", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "renewals")
		newClass(ctx, ns, "small", nil)
		gone := runMachine(ctx, newMachine(ns, "gone", "small"))
		going := runMachine(ctx, newMachine(ns, "going", "small"))
		// While no manager runs, one machine dies and its Lease expires;
		// the other dies just before the new manager starts, its Lease
		// still current when listed. Nothing but that Lease's expiry
		// changes afterwards, so only a timer set from the listing tells.
		Expect(controllers.Paused(func() error {
			if err := provider.Crash(gone.Status.ProviderID); err != nil {
				return err
			}
			time.Sleep((leaseSeconds + 1) * time.Second)
			return provider.Crash(going.Status.ProviderID)
		})).To(Succeed())
		// The new manager counts in metrics of its own.
		metrics = controllers.Manager.Metrics
		expired := WithTransform(condition(machinistv1.ConditionNodeHealthy), PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionFalse), "Reason": Equal(machinistv1.ReasonNodeLeaseExpired),
		})))
		for _, m := range []*machinistv1.Machine{gone, going} {
			Eventually(getMachine(ctx, m)).WithTimeout(leaseSeconds*time.Second+5*time.Second).Should(expired, m.Name)
		}
	})
})
