package e2e

import (
	"slices"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

var _ = Describe("The machinist.dev API", func() {
	It("serves every kind with its short name, category and subresources", func() {
		dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
		Expect(err).NotTo(HaveOccurred())
		list, err := dc.ServerResourcesForGroupVersion(machinistv1.GroupVersion.String())
		Expect(err).NotTo(HaveOccurred())
		byName := map[string]metav1.APIResource{}
		for _, r := range list.APIResources {
			byName[r.Name] = r
		}
		for _, want := range []struct {
			resource, kind, short string
			scale                 bool
			// status is false for a kind that only people write.
			noStatus bool
		}{
			{"machines", "Machine", "ma", false, false},
			{"machinesets", "MachineSet", "ms", true, false},
			{"machinedeployments", "MachineDeployment", "md", true, false},
			{"machineclasses", "MachineClass", "mc", false, false},
			{"machinehealthchecks", "MachineHealthCheck", "mhc", false, false},
			{"machinedisruptionbudgets", "MachineDisruptionBudget", "mdb", false, false},
			{"workloadclusters", "WorkloadCluster", "wc", false, false},
			{"machinedrainrules", "MachineDrainRule", "mdr", false, true},
		} {
			r, ok := byName[want.resource]
			Expect(ok).To(BeTrue(), "resource %s is not served", want.resource)
			Expect(r.Kind).To(Equal(want.kind))
			Expect(r.Namespaced).To(BeTrue())
			Expect(r.ShortNames).To(ConsistOf(want.short))
			Expect(r.Categories).To(ContainElement("machinist"))
			_, hasStatus := byName[want.resource+"/status"]
			Expect(hasStatus).To(Equal(!want.noStatus), "status subresource of %s", want.resource)
			_, hasScale := byName[want.resource+"/scale"]
			Expect(hasScale).To(Equal(want.scale), "scale subresource of %s", want.resource)
			Expect(slices.Contains(r.Verbs, "watch")).To(BeTrue())
		}
	})
})
