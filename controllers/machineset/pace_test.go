package machineset_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// setReconciles reads the MachineSet controller's reconciles so far from
// the manager's own metrics.
func setReconciles() float64 {
	n, err := testenv.ControllerCounter("controller_runtime_reconcile_total", "machineset")
	Expect(err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("Pacing a set's looks", func() {
	It("looks once per spacing however often its Machines change, and still sees every change", func(ctx SpecContext) {
		const n = 20
		ns := env.NewNamespace(GinkgoTB(), "paced", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "paced", n, machinistv1.DeleteRandom))).To(Succeed())
		machines := waitRunning(ctx, ns, n)
		ready := func(ctx context.Context) int32 {
			ms := &machinistv1.MachineSet{}
			Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "paced"}, ms)).To(Succeed())
			return ms.Status.ReadyReplicas
		}
		Eventually(ready).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeNumerically("==", n))

		// Ten changes of every Machine, as fast as the API server takes
		// them: 200 wake-ups of the set, none of which it must answer at
		// once. Its spacing is n × 25ms = 500ms (the suite's PerMachine).
		before, start := setReconciles(), time.Now()
		for round := range 10 {
			for i := range machines {
				patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{"test.machinist.dev/touch":"%d"}}}`, round))
				Expect(k8s.Patch(ctx, &machines[i], patch)).To(Succeed())
			}
		}
		time.Sleep(time.Second) // the last paced look
		looks, took := setReconciles()-before, time.Since(start)
		GinkgoWriter.Printf("200 Machine changes over %s: %.0f looks at the set\n", took, looks)
		Expect(looks).To(BeNumerically("<=", took.Seconds()/0.5+3), "a paced set looks at most once per spacing, plus the spacing's start")
		Expect(looks).To(BeNumerically(">=", 1), "a paced wake-up is postponed, never dropped")

		// A change only its status shows still arrives, within the
		// spacing and the status interval.
		Expect(provider.Crash(machines[0].Status.ProviderID)).To(Succeed())
		Eventually(ready).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeNumerically("==", n-1))
	})
})
