package machinedeployment_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// drifted is each Machine's Drifted condition, by name: status, reason
// and message.
func drifted(g Gomega, ms []machinistv1.Machine) map[string]metav1.Condition {
	out := map[string]metav1.Condition{}
	for _, m := range ms {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionDrifted)
		g.Expect(c).NotTo(BeNil(), "Machine %s has no Drifted condition", m.Name)
		out[m.Name] = *c
	}
	return out
}

var _ = Describe("Drift", func() {
	It("shows which Machines differ from their MachineDeployment's current template, while a paused rollout waits, and clears as the rollout replaces them", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 2, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		Eventually(func(g Gomega) {
			for name, c := range drifted(g, env.Machines(GinkgoTB(), ns)) {
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse), name)
				g.Expect(c.Reason).To(Equal(machinistv1.ReasonUpToDate))
				g.Expect(c.Message).To(Equal("the spec is MachineDeployment pool's current template"))
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())

		patchSpec(ctx, md, `{"paused":true}`)
		upgrade(ctx, md, "v1.37.2")
		Eventually(func(g Gomega) {
			for name, c := range drifted(g, env.Machines(GinkgoTB(), ns)) {
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), name)
				g.Expect(c.Reason).To(Equal(machinistv1.ReasonTemplateChanged))
				g.Expect(c.Message).To(Equal("the spec differs from MachineDeployment pool's current template: version v1.37.1, template v1.37.2"))
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())
		// Said in one write each, not rewritten while the rollout waits.
		written := map[string]string{}
		for _, m := range env.Machines(GinkgoTB(), ns) {
			written[m.Name] = m.ResourceVersion
		}
		Consistently(func() map[string]string {
			now := map[string]string{}
			for _, m := range env.Machines(GinkgoTB(), ns) {
				now[m.Name] = m.ResourceVersion
			}
			return now
		}).WithTimeout(3 * time.Second).Should(Equal(written))

		patchSpec(ctx, md, `{"paused":false}`)
		waitVersion(ctx, md, "v1.37.2", 2)
		Eventually(func(g Gomega) {
			for name, c := range drifted(g, env.Machines(GinkgoTB(), ns)) {
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse), name)
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	It("follows an InPlace rollout: drifted when the template changes, up to date once updated", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 2, inPlace(2, machinistv1.FallbackNever))
		deploy(ctx, md)
		patchSpec(ctx, md, `{"paused":true}`)
		upgrade(ctx, md, "v1.37.2")
		Eventually(func(g Gomega) {
			for name, c := range drifted(g, env.Machines(GinkgoTB(), ns)) {
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), name)
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())
		patchSpec(ctx, md, `{"paused":false}`)
		Eventually(func(g Gomega) {
			ms := env.Machines(GinkgoTB(), ns)
			g.Expect(ms).To(HaveLen(2))
			for name, c := range drifted(g, ms) {
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse), name)
			}
			for _, m := range ms {
				g.Expect(m.Status.NodeInfo).NotTo(BeNil())
				g.Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
			}
		}).WithTimeout(60 * time.Second).Should(Succeed())
	})

	It("compares a MachineSet of no MachineDeployment with its own template", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		labels := map[string]string{"pool": "lone"}
		ms := &machinistv1.MachineSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lone"},
			Spec: machinistv1.MachineSetSpec{
				Replicas: ptr.To[int32](1),
				Selector: machinistv1.LabelSelector{MatchLabels: labels},
				Template: machinistv1.MachineTemplateSpec{
					Metadata: machinistv1.TemplateMetadata{Labels: labels},
					Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.1"},
				},
			},
		}
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		Eventually(func(g Gomega) {
			got := drifted(g, env.Machines(GinkgoTB(), ns))
			g.Expect(got).To(HaveLen(1))
			for _, c := range got {
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Message).To(Equal("the spec is MachineSet lone's template"))
			}
		}).WithTimeout(30 * time.Second).Should(Succeed())
		// A MachineSet replaces no Machine when its template changes.
		patch := []byte(`{"spec":{"template":{"spec":{"nodeLabels":{"zone":"b"}}}}}`)
		Expect(k8s.Patch(ctx, ms, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		Eventually(func(g Gomega) {
			for _, c := range drifted(g, env.Machines(GinkgoTB(), ns)) {
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.Message).To(Equal("the spec differs from MachineSet lone's template: nodeLabels"))
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})
})
