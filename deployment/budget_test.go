package deployment_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

var _ = Describe("A rollout under a disruption budget", func() {
	It("replaces old Machines no faster than the budget allows, whatever maxSurge allows, and finishes", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		// maxSurge 4 would replace all four at once.
		md := newDeployment(ns, "pool", 4, rolling(intstr.FromInt32(4), intstr.FromInt32(0)))
		deploy(ctx, md)
		Expect(k8s.Create(ctx, &machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one-at-a-time"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{
				Selector:     machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "pool"}},
				MaxDisrupted: intstr.FromInt32(1),
				Reasons:      []machinistv1.DisruptionReason{machinistv1.DisruptionRollout},
			},
		})).To(Succeed())
		// Disrupted: an old Machine on its way out, or one not in service.
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			leaving := 0
			for _, m := range ms {
				if m.Spec.Version == "v1.37.1" && m.DeletionTimestamp != nil {
					leaving++
				}
			}
			if leaving > 1 {
				return fmt.Sprintf("%d old Machines deleted at once, the budget allows 1", leaving)
			}
			return ""
		})
		upgrade(ctx, md, "v1.37.2")
		waitVersion(ctx, md, "v1.37.2", 4)
		Expect(mon.bad()).To(BeEmpty())
		// Held at least once: an old set's Events say so.
		Eventually(func() []string {
			var list eventsv1.EventList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			var held []string
			for _, e := range list.Items {
				if e.Regarding.Kind == "MachineSet" && e.Reason == "DisruptionHeld" {
					held = append(held, e.Note)
				}
			}
			return held
		}).WithTimeout(10 * time.Second).Should(ContainElement(ContainSubstring("MachineDisruptionBudget one-at-a-time allows no more disruptions")))
	})
})
