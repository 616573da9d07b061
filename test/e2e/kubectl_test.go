package e2e

import (
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// table splits kubectl's tabular output into its tables (kubectl prints one
// per resource type, separated by a blank line), each a list of rows of fields.
func table(out string) [][][]string {
	var tables [][][]string
	for _, block := range strings.Split(strings.TrimSpace(out), "\n\n") {
		var rows [][]string
		for _, line := range strings.Split(block, "\n") {
			rows = append(rows, strings.Fields(line))
		}
		tables = append(tables, rows)
	}
	return tables
}

var _ = Describe("kubectl", func() {
	It("scales a MachineSet and a MachineDeployment through the scale subresource", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		ms := validMachineSet(ns, "workers", 1)
		md := validMachineDeployment(ns, "pool")
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		Expect(k8s.Create(ctx, md)).To(Succeed())

		out, err := env.Kubectl(ctx, "-n", ns, "scale", "machineset", "workers", "--replicas=5")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("machineset.machinist.dev/workers scaled"))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
		Expect(*ms.Spec.Replicas).To(BeEquivalentTo(5))

		_, err = env.Kubectl(ctx, "-n", ns, "scale", "md/pool", "--replicas=0")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), md)).To(Succeed())
		Expect(*md.Spec.Replicas).To(BeEquivalentTo(0))

		By("refusing a negative count without changing anything")
		_, err = env.Kubectl(ctx, "-n", ns, "scale", "ms/workers", "--replicas=-1")
		Expect(err).To(HaveOccurred())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
		Expect(*ms.Spec.Replicas).To(BeEquivalentTo(5))
	})

	It("prints each kind's columns", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		m := validMachine(ns, "worker-0")
		ms := validMachineSet(ns, "workers", 3)
		md := validMachineDeployment(ns, "pool")
		for _, o := range []client.Object{m, ms, md} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		m.Status = machinistv1.MachineStatus{
			Phase:      machinistv1.MachineRunning,
			NodeRef:    &machinistv1.NodeReference{Name: "node-0"},
			ProviderID: "inmemory:///worker-0",
		}
		Expect(k8s.Status().Update(ctx, m)).To(Succeed())
		ms.Status = machinistv1.MachineSetStatus{Replicas: 3, ReadyReplicas: 2, AvailableReplicas: 1}
		Expect(k8s.Status().Update(ctx, ms)).To(Succeed())
		md.Status = machinistv1.MachineDeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3, Phase: machinistv1.RolloutProgressing}
		Expect(k8s.Status().Update(ctx, md)).To(Succeed())

		out, err := env.Kubectl(ctx, "-n", ns, "get", "ma,ms,md")
		Expect(err).NotTo(HaveOccurred())
		tables := table(out)
		Expect(tables).To(HaveLen(3), out)

		Expect(tables[0][0]).To(Equal([]string{"NAME", "PHASE", "NODE", "PROVIDERID", "VERSION", "AGE"}))
		Expect(tables[0][1][:5]).To(Equal([]string{"machine.machinist.dev/worker-0", "Running", "node-0", "inmemory:///worker-0", "v1.37.2"}))

		Expect(tables[1][0]).To(Equal([]string{"NAME", "DESIRED", "CURRENT", "READY", "AVAILABLE", "AGE"}))
		Expect(tables[1][1][:5]).To(Equal([]string{"machineset.machinist.dev/workers", "3", "3", "2", "1"}))

		Expect(tables[2][0]).To(Equal([]string{"NAME", "DESIRED", "UPDATED", "READY", "AVAILABLE", "PHASE", "AGE"}))
		Expect(tables[2][1][:6]).To(Equal([]string{"machinedeployment.machinist.dev/pool", "3", "1", "3", "3", "Progressing"}))
	})

	It("lists every kind under the machinist category", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		for _, o := range []client.Object{
			validMachineClass(ns, "small"),
			validMachine(ns, "worker-0"),
			validMachineSet(ns, "workers", 1),
			validMachineDeployment(ns, "pool"),
		} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		out, err := env.Kubectl(ctx, "-n", ns, "get", "machinist", "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(out)).To(ConsistOf(
			"machineclass.machinist.dev/small",
			"machine.machinist.dev/worker-0",
			"machineset.machinist.dev/workers",
			"machinedeployment.machinist.dev/pool",
		))
		out, err = env.Kubectl(ctx, "-n", ns, "get", "mc", "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("machineclass.machinist.dev/small"))
	})

	It("applies the samples in config/samples cleanly", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		samples := filepath.Join(env.Root, "config", "samples")
		out, err := env.Kubectl(ctx, "-n", ns, "apply", "--server-side", "-f", samples)
		Expect(err).NotTo(HaveOccurred())
		files, err := filepath.Glob(filepath.Join(samples, "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Split(strings.TrimSpace(out), "\n")).To(HaveLen(len(files)), out)

		By("defaulting what the samples leave out")
		md := &machinistv1.MachineDeployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-a"}, md)).To(Succeed())
		Expect(*md.Spec.RevisionHistoryLimit).To(BeEquivalentTo(10))
		ms := &machinistv1.MachineSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "workers"}, ms)).To(Succeed())
		Expect(ms.Spec.DeletePolicy).To(Equal(machinistv1.DeleteOldest))
		Expect(ms.CreationTimestamp).NotTo(Equal(metav1.Time{}))
	})
})
