package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// defaultedSpec is what the server stores for a MachineHealthCheck that
// gives only its selector: the defaults docs/api.md lists.
func defaultedSpec(selector metav1.LabelSelector) machinistv1.MachineHealthCheckSpec {
	return machinistv1.MachineHealthCheckSpec{
		Selector:           selector,
		NodeStartupTimeout: &metav1.Duration{Duration: 10 * time.Minute},
		UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
			{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: time.Minute}},
			{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: time.Minute}},
		},
		Remediation: machinistv1.Remediation{
			Ladder: []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "", "5m"),
				rung(machinistv1.RemediateRepair, "", "15m"),
				rung(machinistv1.RemediateReplace, "", ""),
			},
			MaxInFlight: ptr.To(intstr.FromInt32(1)),
			Cooldown:    &metav1.Duration{Duration: 30 * time.Minute},
		},
		MaxUnhealthy: ptr.To(intstr.FromString("100%")),
	}
}

var _ = Describe("MachineHealthCheck defaults", func() {
	It("fills in everything a health check written with only a selector leaves out", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		// As YAML would be: no remediation at all, so the server must
		// default it to {} before it can default the fields inside.
		Expect(k8s.Create(ctx, healthCheckYAML(ns, "minimal", nil))).To(Succeed())
		hc := &machinistv1.MachineHealthCheck{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "minimal"}, hc)).To(Succeed())
		want := defaultedSpec(metav1.LabelSelector{MatchLabels: map[string]string{"pool": "minimal"}})
		Expect(hc.Spec).To(Equal(want))

		By("giving a health check made with the Go type, which sends remediation: {}, the same")
		typed := validMachineHealthCheck(ns, "typed")
		Expect(k8s.Create(ctx, typed)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(typed), typed)).To(Succeed())
		Expect(typed.Spec).To(Equal(defaultedSpec(typed.Spec.Selector)))
	})

	It("keeps every field a health check sets", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		hc := fullMachineHealthCheck(ns, "full")
		want := hc.Spec.DeepCopy()
		Expect(k8s.Create(ctx, hc)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(hc), hc)).To(Succeed())
		Expect(hc.Spec).To(Equal(*want))
	})

	It("defaults only the fields left out, one by one", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		hc := validMachineHealthCheck(ns, "partial")
		hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("20%"))
		Expect(k8s.Create(ctx, hc)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(hc), hc)).To(Succeed())
		want := defaultedSpec(hc.Spec.Selector)
		want.Remediation.MaxInFlight = ptr.To(intstr.FromString("20%"))
		Expect(hc.Spec).To(Equal(want))
	})
})
