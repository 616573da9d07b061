package machineset_test

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var _ = Describe("A paused MachineSet", func() {
	It("makes, deletes and writes nothing until it is resumed, then catches up", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "paused", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "pool", 2, machinistv1.DeleteRandom))).To(Succeed())
		machines := waitRunning(ctx, ns, 2)
		key := types.NamespacedName{Namespace: ns, Name: "pool"}
		set := func() *machinistv1.MachineSet {
			ms := &machinistv1.MachineSet{}
			Expect(k8s.Get(ctx, key, ms)).To(Succeed())
			return ms
		}
		paused := func() *metav1.Condition {
			return meta.FindStatusCondition(set().Status.Conditions, machinistv1.ConditionPaused)
		}
		Expect(paused()).To(BeNil(), "a set never paused carries no Paused condition")

		annotateSet(ctx, key, map[string]any{machinistv1.PausedAnnotation: "true"})
		Eventually(paused).WithTimeout(10 * time.Second).Should(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionTrue), "Reason": Equal(machinistv1.ReasonPaused),
		})))
		before := set()

		// One of its machines is killed and its Machine deleted, as a
		// health check replacing it would; and the set is scaled up.
		Expect(provider.Crash(machines[0].Status.ProviderID)).To(Succeed())
		Expect(k8s.Delete(ctx, &machines[0])).To(Succeed())
		scale(ctx, ns, "pool", 3)
		Eventually(func() []machinistv1.Machine { return env.Machines(GinkgoTB(), ns) }).WithTimeout(30*time.Second).Should(HaveLen(1),
			"the deleted Machine is gone")
		Consistently(func(g Gomega) {
			g.Expect(env.Machines(GinkgoTB(), ns)).To(HaveLen(1), "a paused set made a Machine")
			g.Expect(set().Status).To(Equal(before.Status), "a paused set wrote its status")
		}).WithTimeout(5 * time.Second).Should(Succeed())

		annotateSet(ctx, key, map[string]any{machinistv1.PausedAnnotation: nil})
		waitRunning(ctx, ns, 3)
		Eventually(paused).WithTimeout(10 * time.Second).Should(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionFalse), "Reason": Equal(machinistv1.ReasonNotPaused),
		})))
		Eventually(func() int32 { return set().Status.ReadyReplicas }).WithTimeout(30 * time.Second).Should(BeNumerically("==", 3))
	})
})

// annotateSet merges annotations into the set's (nil removes one).
func annotateSet(ctx SpecContext, key types.NamespacedName, annotations map[string]any) {
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	Expect(err).NotTo(HaveOccurred())
	ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	Expect(k8s.Patch(ctx, ms, client.RawPatch(types.MergePatchType, raw))).To(Succeed())
}
