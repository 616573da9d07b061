package e2e

import (
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
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
	It("explains, gets and scales at both versions, v1beta1 by default", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		ms := validMachineSet(ns, "workers", 1)
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		rule := validMachineDrainRule(ns, "databases")
		Expect(k8s.Create(ctx, rule)).To(Succeed())

		// explain: each version's own fields.
		out, err := env.Kubectl(ctx, "explain", "machinedrainrules.spec")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(And(ContainSubstring("VERSION:    v1beta1"), ContainSubstring("behavior"), ContainSubstring("order")))
		Expect(out).NotTo(ContainSubstring("drain\t"))
		out, err = env.Kubectl(ctx, "explain", "machinedrainrules.spec", "--api-version=machinist.dev/v1alpha1")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(And(ContainSubstring("VERSION:    v1alpha1"), ContainSubstring("drain")))
		out, err = env.Kubectl(ctx, "explain", "machines.status")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).NotTo(ContainSubstring("failureReason"), "v1beta1 says why a Machine failed in its Ready condition")

		// get: the same object at each version, in each version's shape.
		out, err = env.Kubectl(ctx, "-n", ns, "get", "machinedrainrule", "databases", "-o", "jsonpath={.apiVersion} {.spec.behavior}")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("machinist.dev/v1beta1 " + string(rule.Spec.Drain.Behavior)))
		out, err = env.Kubectl(ctx, "-n", ns, "get", "machinedrainrules.v1alpha1.machinist.dev", "databases", "-o", "jsonpath={.apiVersion} {.spec.drain.behavior}")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("machinist.dev/v1alpha1 " + string(rule.Spec.Drain.Behavior)))
		out, err = env.Kubectl(ctx, "-n", ns, "get", "machinesets.v1alpha1.machinist.dev")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("workers"))

		// scale: through the scale subresource of each version.
		_, err = env.Kubectl(ctx, "-n", ns, "scale", "machineset", "workers", "--replicas=3")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
		Expect(*ms.Spec.Replicas).To(BeEquivalentTo(3))
		_, err = env.Kubectl(ctx, "-n", ns, "scale", "machinesets.v1alpha1.machinist.dev", "workers", "--replicas=2")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
		Expect(*ms.Spec.Replicas).To(BeEquivalentTo(2))
	})

	It("scales a MachineSet and a MachineDeployment through the scale subresource", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
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
	})

	// kubectl scale refuses --replicas=-1 itself, so these requests are
	// written to the scale subresource directly: what any other client, such
	// as an autoscaler, can send.
	It("refuses a negative count sent to the scale subresource without changing anything", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		ms := validMachineSet(ns, "workers", 2)
		md := validMachineDeployment(ns, "pool")
		for _, o := range []client.Object{ms, md} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
			want := *replicasOf(o)

			By("updating the Scale of " + o.GetName())
			scale := &autoscalingv1.Scale{}
			Expect(k8s.SubResource("scale").Get(ctx, o, scale)).To(Succeed())
			Expect(scale.Spec.Replicas).To(Equal(want))
			scale.Spec.Replicas = -1
			err := k8s.SubResource("scale").Update(ctx, o, client.WithSubResourceBody(scale))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			Expect(err.Error()).To(Equal(invalidMessage(o, negativeReplicas)), "the server said:\n%s", err)

			By("patching the Scale of " + o.GetName())
			err = k8s.SubResource("scale").Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":-1}}`)),
				client.WithSubResourceBody(&autoscalingv1.Scale{}))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			Expect(err.Error()).To(Equal(invalidMessage(o, negativeReplicas)), "the server said:\n%s", err)

			stored := o.DeepCopyObject().(client.Object)
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), stored)).To(Succeed())
			Expect(*replicasOf(stored)).To(Equal(want))
			Expect(stored.GetResourceVersion()).To(Equal(o.GetResourceVersion()))
		}
	})

	It("prints each kind's columns", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		m := machineInCluster(ns, "worker-0", "prod")
		ms := validMachineSet(ns, "workers", 3)
		md := validMachineDeployment(ns, "pool")
		for _, o := range []client.Object{m, ms, md} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		m.Status = machinistv1.MachineStatus{
			Phase:      machinistv1.MachineRunning,
			NodeRef:    &machinistv1.NodeReference{Name: "node-0"},
			ProviderID: "inmemory:///worker-0",
			Conditions: []metav1.Condition{{
				Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "NodeLeaseExpired",
				Message: "Node node-0's kubelet has not renewed its Lease", LastTransitionTime: metav1.Now(),
			}, {
				Type: machinistv1.ConditionDrifted, Status: metav1.ConditionTrue, Reason: "TemplateChanged",
				Message: "the spec differs from MachineSet workers's template: version v1.37.2, template v1.37.3", LastTransitionTime: metav1.Now(),
			}},
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

		Expect(tables[0][0]).To(Equal([]string{"NAME", "PHASE", "READY", "REASON", "NODE", "CLUSTER", "VERSION", "AGE"}))
		Expect(tables[0][1][:7]).To(Equal([]string{"machine.machinist.dev/worker-0", "Running", "False", "NodeLeaseExpired", "node-0", "prod", "v1.37.2"}))

		By("showing the providerID, whether it drifted and the reason's message with -o wide")
		wide, err := env.Kubectl(ctx, "-n", ns, "get", "ma", "-o", "wide")
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(wide), "\n")
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "PHASE", "READY", "REASON", "NODE", "CLUSTER", "VERSION", "AGE", "PROVIDERID", "DRIFTED", "MESSAGE"}))
		Expect(lines[1]).To(ContainSubstring("inmemory:///worker-0   True "))
		Expect(lines[1]).To(HaveSuffix("Node node-0's kubelet has not renewed its Lease"))

		Expect(tables[1][0]).To(Equal([]string{"NAME", "DESIRED", "CURRENT", "READY", "AVAILABLE", "AGE"}))
		Expect(tables[1][1][:5]).To(Equal([]string{"machineset.machinist.dev/workers", "3", "3", "2", "1"}))

		Expect(tables[2][0]).To(Equal([]string{"NAME", "DESIRED", "UPDATED", "READY", "AVAILABLE", "PHASE", "AGE"}))
		Expect(tables[2][1][:6]).To(Equal([]string{"machinedeployment.machinist.dev/pool", "3", "1", "3", "3", "Progressing"}))
	})

	It("leaves a Machine's CLUSTER blank when it serves the manager's own cluster", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		Expect(k8s.Create(ctx, validMachine(ns, "local"))).To(Succeed())
		Expect(k8s.Create(ctx, machineInCluster(ns, "remote", "prod"))).To(Succeed())
		out, err := env.Kubectl(ctx, "-n", ns, "get", "ma", "-o", "custom-columns=NAME:.metadata.name,CLUSTER:.spec.clusterName")
		Expect(err).NotTo(HaveOccurred())
		Expect(table(out)).To(Equal([][][]string{{{"NAME", "CLUSTER"}, {"local", "<none>"}, {"remote", "prod"}}}))

		out, err = env.Kubectl(ctx, "-n", ns, "get", "ma")
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(3), out)
		// The column starts where its header does; a blank cell leaves
		// spaces there.
		at := strings.Index(lines[0], "CLUSTER")
		Expect(at).To(BeNumerically(">", 0), out)
		Expect(lines[1]).To(HavePrefix("local "))
		Expect(strings.TrimSpace(lines[1][at:at+len("prod")])).To(BeEmpty(), out)
		Expect(lines[2]).To(HavePrefix("remote "))
		Expect(lines[2][at:at+len("prod")]).To(Equal("prod"), out)
	})

	It("prints a WorkloadCluster's reachability and counts, and its server and message with -o wide", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		prod := validWorkloadCluster(ns, "prod")
		lost := validWorkloadCluster(ns, "lost")
		for _, o := range []*machinistv1.WorkloadCluster{prod, lost} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		prod.Status = machinistv1.WorkloadClusterStatus{
			Server: "https://prod.example:6443", Version: "v1.37.2", Nodes: ptr.To(int32(12)), Machines: ptr.To(int32(10)),
			Conditions: []metav1.Condition{{
				Type: machinistv1.WorkloadClusterReachable, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonClusterConnected,
				Message: "reading the cluster's API", LastTransitionTime: metav1.Now(),
			}},
		}
		Expect(k8s.Status().Update(ctx, prod)).To(Succeed())
		lost.Status = machinistv1.WorkloadClusterStatus{
			Machines: ptr.To(int32(0)),
			Conditions: []metav1.Condition{{
				Type: machinistv1.WorkloadClusterReachable, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonKubeconfigSecretMissing,
				Message: `Secret "lost-kubeconfig" not found`, LastTransitionTime: metav1.Now(),
			}},
		}
		Expect(k8s.Status().Update(ctx, lost)).To(Succeed())

		out, err := env.Kubectl(ctx, "-n", ns, "get", "wc")
		Expect(err).NotTo(HaveOccurred())
		tables := table(out)
		Expect(tables).To(HaveLen(1), out)
		Expect(tables[0]).To(HaveLen(3), out)
		Expect(tables[0][0]).To(Equal([]string{"NAME", "REACHABLE", "REASON", "VERSION", "NODES", "MACHINES", "AGE"}))
		// Sorted by name: lost, then prod. lost never reached its cluster,
		// so it has no version and no Node count: those cells are blank.
		Expect(tables[0][1]).To(HaveLen(5), out)
		Expect(tables[0][1][:4]).To(Equal([]string{"lost", "False", "KubeconfigSecretMissing", "0"}))
		Expect(tables[0][2]).To(HaveLen(7), out)
		Expect(tables[0][2][:6]).To(Equal([]string{"prod", "True", "Connected", "v1.37.2", "12", "10"}))

		wide, err := env.Kubectl(ctx, "-n", ns, "get", "workloadcluster", "prod", "-o", "wide")
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(wide), "\n")
		Expect(lines).To(HaveLen(2), wide)
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "REACHABLE", "REASON", "VERSION", "NODES", "MACHINES", "AGE", "SERVER", "MESSAGE"}))
		Expect(lines[1]).To(ContainSubstring(" https://prod.example:6443 "))
		Expect(lines[1]).To(HaveSuffix("reading the cluster's API"))
	})

	It("prints a MachineHealthCheck's counts, and its reason with -o wide", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		hc := validMachineHealthCheck(ns, "workers")
		Expect(k8s.Create(ctx, hc)).To(Succeed())
		hc.Status = machinistv1.MachineHealthCheckStatus{
			ExpectedMachines: 5, HealthyMachines: 2, UnhealthyMachines: 3, RemediationsInFlight: 1, RemediationsAllowed: 0,
			Conditions: []metav1.Condition{{
				Type: machinistv1.ConditionRemediationAllowed, Status: metav1.ConditionFalse, Reason: "TooManyUnhealthy",
				Message: "3 of 5 Machines are unhealthy", LastTransitionTime: metav1.Now(),
			}},
		}
		Expect(k8s.Status().Update(ctx, hc)).To(Succeed())

		out, err := env.Kubectl(ctx, "-n", ns, "get", "mhc")
		Expect(err).NotTo(HaveOccurred())
		tables := table(out)
		Expect(tables).To(HaveLen(1), out)
		Expect(tables[0]).To(HaveLen(2), out)
		Expect(tables[0][0]).To(Equal([]string{"NAME", "EXPECTED", "HEALTHY", "UNHEALTHY", "IN-FLIGHT", "ALLOWED", "AGE"}))
		Expect(tables[0][1][:6]).To(Equal([]string{"workers", "5", "2", "3", "1", "0"}))

		wide, err := env.Kubectl(ctx, "-n", ns, "get", "machinehealthcheck", "workers", "-o", "wide")
		Expect(err).NotTo(HaveOccurred())
		tables = table(wide)
		Expect(tables[0][0]).To(Equal([]string{"NAME", "EXPECTED", "HEALTHY", "UNHEALTHY", "IN-FLIGHT", "ALLOWED", "AGE", "REASON"}))
		Expect(tables[0][1][6:]).To(HaveLen(2), wide)
		Expect(tables[0][1][7]).To(Equal("TooManyUnhealthy"))
	})

	It("prints a MachineDisruptionBudget's limit and counts", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		count := validMachineDisruptionBudget(ns, "count")
		percent := validMachineDisruptionBudget(ns, "percent")
		percent.Spec.MaxDisrupted = intstr.FromString("25%")
		percent.Spec.Windows = []machinistv1.DisruptionWindow{window("0 2 * * 1-5", "4h", "")}
		for _, o := range []*machinistv1.MachineDisruptionBudget{count, percent} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		count.Status = machinistv1.MachineDisruptionBudgetStatus{SelectedMachines: 5, MaxDisrupted: 1, Disrupted: 1, DisruptionsAllowed: 0, WindowOpen: true}
		Expect(k8s.Status().Update(ctx, count)).To(Succeed())
		percent.Status = machinistv1.MachineDisruptionBudgetStatus{SelectedMachines: 8, MaxDisrupted: 2, Disrupted: 1, DisruptionsAllowed: 1, WindowOpen: true}
		Expect(k8s.Status().Update(ctx, percent)).To(Succeed())

		out, err := env.Kubectl(ctx, "-n", ns, "get", "mdb")
		Expect(err).NotTo(HaveOccurred())
		tables := table(out)
		Expect(tables).To(HaveLen(1), out)
		Expect(tables[0]).To(HaveLen(3), out)
		Expect(tables[0][0]).To(Equal([]string{"NAME", "MAX", "SELECTED", "DISRUPTED", "ALLOWED", "NEXT-WINDOW", "AGE"}))
		// While a window is open there is no next one: its cell is blank,
		// so the age follows the counts.
		Expect(tables[0][1]).To(HaveLen(6), out)
		Expect(tables[0][1][:5]).To(Equal([]string{"count", "1", "5", "1", "0"}))
		Expect(tables[0][2]).To(HaveLen(6), out)
		Expect(tables[0][2][:5]).To(Equal([]string{"percent", "25%", "8", "1", "1"}))
	})

	It("lists every kind under the machinist category", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		for _, o := range []client.Object{
			validMachineClass(ns, "small"),
			validMachine(ns, "worker-0"),
			validMachineSet(ns, "workers", 1),
			validMachineDeployment(ns, "pool"),
			validMachineHealthCheck(ns, "workers"),
			validMachineDisruptionBudget(ns, "workers"),
			validWorkloadCluster(ns, "prod"),
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
			"machinehealthcheck.machinist.dev/workers",
			"machinedisruptionbudget.machinist.dev/workers",
			"workloadcluster.machinist.dev/prod",
		))
		out, err = env.Kubectl(ctx, "-n", ns, "get", "mc", "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("machineclass.machinist.dev/small"))
		out, err = env.Kubectl(ctx, "-n", ns, "get", "wc", "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(Equal("workloadcluster.machinist.dev/prod"))
	})

	It("applies the samples in config/samples cleanly", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
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
