package machinedeployment_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var _ = Describe("Pacing a MachineDeployment's looks", func() {
	It("looks at a deployment of one set only when the set's status changes, and once per spacing while two sets trade Machines", func(ctx SpecContext) {
		const n = 20
		ns := env.NewNamespace(GinkgoTB(), "paced", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", n, rolling(intstr.FromInt32(2), intstr.FromInt32(0)))
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(func() int {
			running := 0
			for _, m := range env.Machines(GinkgoTB(), ns) {
				if m.Status.Phase == machinistv1.MachineRunning {
					running++
				}
			}
			return running
		}).WithTimeout(90 * time.Second).Should(Equal(n))
		Eventually(func() int32 { return getMD(ctx, md).Status.AvailableReplicas }).WithTimeout(30 * time.Second).Should(BeNumerically("==", n))
		time.Sleep(2 * time.Second) // the scale-up's trailing looks

		looks := func() float64 {
			v, err := testenv.ControllerCounter("controller_runtime_reconcile_total", "machinedeployment")
			Expect(err).NotTo(HaveOccurred())
			return v
		}
		// 200 changes of the Machines of a deployment with one set: none
		// changes what it decides, nor its set's status, which is its own.
		// A Machine may be gone by the time it is touched (the crashed one
		// below is replaced by its set): that is not what is measured.
		touch := func(machines []machinistv1.Machine) (looked float64, took time.Duration) {
			before, start := looks(), time.Now()
			for round := range 10 {
				for i := range machines {
					patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{"test.machinist.dev/touch":"%d"}}}`, round))
					Expect(client.IgnoreNotFound(k8s.Patch(ctx, &machines[i], patch))).To(Succeed())
				}
			}
			time.Sleep(time.Second)
			return looks() - before, time.Since(start)
		}
		got, took := touch(env.Machines(GinkgoTB(), ns))
		GinkgoWriter.Printf("one set: 200 Machine changes over %s: %.0f looks at the deployment\n", took, got)
		Expect(got).To(BeNumerically("<=", 1), "a deployment of one set looks at none of its Machines' changes")

		// What only a Machine's status shows still reaches it, through its
		// set's status.
		machines := env.Machines(GinkgoTB(), ns)
		Expect(provider.Crash(machines[0].Status.ProviderID)).To(Succeed())
		Eventually(func() int32 { return getMD(ctx, md).Status.AvailableReplicas }).WithContext(ctx).WithTimeout(60 * time.Second).Should(BeNumerically("<", n))

		// A rollout held by a budget: two sets in use, whose Machines'
		// changes may let it move, paced. Its spacing is about n × 10ms
		// (the suite's PerMachine).
		Expect(k8s.Create(ctx, poolBudget(ns, "none", 0, machinistv1.DisruptionRollout))).To(Succeed())
		upgrade(ctx, md, "v1.37.2")
		expectHeld(ctx, md, 60*time.Second, "allows no more disruptions")
		got, took = touch(env.Machines(GinkgoTB(), ns))
		GinkgoWriter.Printf("two sets: 200 Machine changes over %s: %.0f looks at the deployment\n", took, got)
		// Its sets' status writes (at most one a second each) wake it too.
		Expect(got).To(BeNumerically("<=", took.Seconds()/0.2+2*took.Seconds()+3))
		Expect(got).To(BeNumerically(">=", 1), "a paced wake-up is postponed, never dropped")
	})
})
