package deployment_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/testenv"
)

var _ = Describe("Pacing a MachineDeployment's looks", func() {
	It("looks once per spacing however often its Machines change", func(ctx SpecContext) {
		const n = 20
		ns := env.NewNamespace(GinkgoTB(), "paced", testenv.Small)
		Expect(k8s.Create(ctx, newDeployment(ns, "paced", n, machinistv1.MachineDeploymentStrategy{}))).To(Succeed())
		Eventually(func() int {
			running := 0
			for _, m := range env.Machines(GinkgoTB(), ns) {
				if m.Status.Phase == machinistv1.MachineRunning {
					running++
				}
			}
			return running
		}).WithTimeout(90 * time.Second).Should(Equal(n))
		machines := env.Machines(GinkgoTB(), ns)
		time.Sleep(2 * time.Second) // the scale-up's trailing looks

		looks := func() float64 {
			v, err := testenv.ControllerCounter("controller_runtime_reconcile_total", "machinedeployment")
			Expect(err).NotTo(HaveOccurred())
			return v
		}
		// 200 changes, none of which the deployment must answer at once;
		// its spacing is n × 10ms = 200ms (the suite's PerMachine).
		before, start := looks(), time.Now()
		for round := range 10 {
			for i := range machines {
				patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{"test.machinist.dev/touch":"%d"}}}`, round))
				Expect(k8s.Patch(ctx, &machines[i], patch)).To(Succeed())
			}
		}
		time.Sleep(time.Second)
		got, took := looks()-before, time.Since(start)
		GinkgoWriter.Printf("200 Machine changes over %s: %.0f looks at the deployment\n", took, got)
		// Its sets' status writes (at most one a second each) wake it too.
		Expect(got).To(BeNumerically("<=", took.Seconds()/0.2+2*took.Seconds()+3))
		Expect(got).To(BeNumerically(">=", 1))
	})
})
