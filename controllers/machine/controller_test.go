package machine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func newClass(ctx context.Context, ns, name string, spec *inmemorySpec) *machinistv1.MachineClass {
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineClassSpec{
			Provider: "inmemory",
			NodeTemplate: &machinistv1.NodeTemplate{
				NodeLabels: machinistv1.NodeLabels{"machinist.dev/class": name},
			},
		},
	}
	if spec != nil {
		raw, err := json.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		class.Spec.ProviderSpec = runtime.RawExtension{Raw: raw}
	}
	Expect(k8s.Create(ctx, class)).To(Succeed())
	return class
}

// inmemorySpec is the part of the in-memory provider's providerSpec the
// specs use.
type inmemorySpec struct {
	NeverReady    bool            `json:"neverReady,omitempty"`
	FailCreate    string          `json:"failCreate,omitempty"`
	RebootLatency metav1.Duration `json:"rebootLatency,omitempty"`
	FailReboot    string          `json:"failReboot,omitempty"`
	FailUpdate    string          `json:"failUpdate,omitempty"`
}

func newMachine(ns, name, class string) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineSpec{
			ClassRef:   machinistv1.ClassReference{Name: class},
			Version:    "v1.37.2",
			NodeLabels: map[string]string{"pool": "blue"},
			NodeTaints: machinistv1.NodeTaints{{Key: "dedicated", Value: "batch", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
}

// phaseLog records every distinct phase a Machine shows on a watch, in order.
type phaseLog struct {
	mu     sync.Mutex
	phases []machinistv1.MachinePhase
	seen   []*machinistv1.Machine
	// broken says why the watch stopped delivering, if it did: a log that
	// silently stopped would pass any check on what it did not see.
	broken []string
}

func (l *phaseLog) get() []machinistv1.MachinePhase {
	l.mu.Lock()
	broken, out := append([]string(nil), l.broken...), append([]machinistv1.MachinePhase(nil), l.phases...)
	l.mu.Unlock()
	Expect(broken).To(BeEmpty(), "the Machine watch failed")
	return out
}

func (l *phaseLog) fail(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.broken = append(l.broken, why)
}

// watchPhases starts a watch on the namespace's Machines before anything is
// created, so no phase can be missed. An empty phase is logged as Pending.
func watchPhases(ctx context.Context, ns, name string) *phaseLog {
	events, err := env.WatchMachines(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	l := &phaseLog{}
	go func() {
		defer GinkgoRecover()
		defer func() {
			if ctx.Err() == nil {
				l.fail("the watch ended before the spec did")
			}
		}()
		for ev := range events {
			m, ok := ev.Object.(*machinistv1.Machine)
			if !ok {
				l.fail(fmt.Sprintf("the watch delivered %s %#v", ev.Type, ev.Object))
				continue
			}
			if m.Name != name || ev.Type == watch.Deleted {
				continue
			}
			p := m.Status.Phase
			if p == "" {
				p = machinistv1.MachinePending
			}
			l.mu.Lock()
			if len(l.phases) == 0 || l.phases[len(l.phases)-1] != p {
				l.phases = append(l.phases, p)
			}
			l.seen = append(l.seen, m.DeepCopy())
			l.mu.Unlock()
		}
	}()
	return l
}

func getMachine(ctx context.Context, m *machinistv1.Machine) func() *machinistv1.Machine {
	return func() *machinistv1.Machine {
		out := &machinistv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m), out)).To(Succeed())
		return out
	}
}

func phase(m *machinistv1.Machine) machinistv1.MachinePhase { return m.Status.Phase }

func condition(t string) func(*machinistv1.Machine) *metav1.Condition {
	return func(m *machinistv1.Machine) *metav1.Condition {
		return meta.FindStatusCondition(m.Status.Conditions, t)
	}
}

func transitions(from, to, event string) float64 {
	return testutil.ToFloat64(metrics.Transitions.WithLabelValues(from, to, event))
}

// phaseDuration reads the time-in-phase histogram as a scrape would: how
// many times a Machine was seen leaving phase, and their seconds there.
func phaseDuration(phase string) (count uint64, seconds float64) {
	reg := prometheus.NewPedanticRegistry()
	Expect(reg.Register(metrics.TimeInPhase)).To(Succeed())
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" && l.GetValue() == phase {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// machinesByPhase reads the machinist_machines gauge as a scrape would.
func machinesByPhase() map[string]float64 {
	reg := prometheus.NewPedanticRegistry()
	Expect(reg.Register(metricsCollector())).To(Succeed())
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "machinist_machines" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// listedByPhase counts every Machine in the cluster by phase, read from
// the API server, with a zero for each phase a Machine can be stored in.
func listedByPhase(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	for _, p := range []string{"Pending", "Provisioning", "Running", "Draining", "Rebooting", "Repairing", "Updating", "Deleting", "Failed"} {
		out[p] = 0
	}
	var list machinistv1.MachineList
	Expect(k8s.List(ctx, &list)).To(Succeed())
	for _, m := range list.Items {
		p := string(m.Status.Phase)
		if p == "" {
			p = "Pending"
		}
		out[p]++
	}
	return out
}

// counted returns how much the value f reads has grown since now.
func counted[T float64 | uint64](f func() T) func() T {
	before := f()
	return func() T { return f() - before }
}

func durationCount(phase string) func() uint64 {
	return func() uint64 { n, _ := phaseDuration(phase); return n }
}

func durationSum(phase string) func() float64 {
	return func() float64 { _, s := phaseDuration(phase); return s }
}

func transitionsOf(from, to, event string) func() float64 {
	return func() float64 { return transitions(from, to, event) }
}

// runMachine creates a Machine and waits until it is Running.
func runMachine(ctx context.Context, m *machinistv1.Machine) *machinistv1.Machine {
	Expect(k8s.Create(ctx, m)).To(Succeed())
	Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(WithTransform(phase, Equal(machinistv1.MachineRunning)))
	return getMachine(ctx, m)()
}

func node(ctx context.Context, name string) *corev1.Node {
	n := &corev1.Node{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
	return n
}

// boundPod creates a pod already scheduled to nodeName.
func boundPod(ctx context.Context, ns, name, nodeName string, labels map[string]string, owner *metav1.OwnerReference) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
		},
	}
	if owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	return pod
}

func podExists(ctx context.Context, pod *corev1.Pod) func() bool {
	return func() bool {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return false
		}
		Expect(err).NotTo(HaveOccurred())
		return true
	}
}

var _ = Describe("The Machine controller", func() {
	It("provisions a Machine through Pending, Provisioning and Running", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		// Specs run one at a time and no other Machine is created or left
		// moving meanwhile, so every change to the counters below is m0's.
		started := time.Now()
		provisioned := counted(transitionsOf("Pending", "Provisioning", "provision"))
		ran := counted(transitionsOf("Provisioning", "Running", "provisioned"))
		leftPending := counted(durationCount("Pending"))
		leftProvisioning := counted(durationCount("Provisioning"))
		inProvisioning := counted(durationSum("Provisioning"))
		log := watchPhases(ctx, ns, "m0")
		m := runMachine(ctx, newMachine(ns, "m0", "small"))

		Eventually(log.get).Should(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
		}))
		Consistently(log.get, "1s").Should(HaveLen(3))

		By("writing the Machine four times: create, finalizer, Provisioning, Running")
		writes := func() int {
			log.mu.Lock()
			defer log.mu.Unlock()
			return len(log.seen)
		}
		Consistently(writes, 2*leaseSeconds*time.Second).Should(Equal(4), "lease rechecks of a healthy Node write nothing")

		By("recording the Node, its boot ID and its info")
		Expect(m.Status.ProviderID).To(HavePrefix("inmemory://"))
		Expect(m.Status.NodeRef).NotTo(BeNil())
		n := node(ctx, m.Status.NodeRef.Name)
		Expect(n.Spec.ProviderID).To(Equal(m.Status.ProviderID))
		Expect(m.Status.BootID).To(Equal(n.Status.NodeInfo.BootID))
		Expect(m.Status.BootID).NotTo(BeEmpty())
		Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
		Expect(m.Status.LastTransition).To(PointTo(MatchFields(IgnoreExtras, Fields{
			"From": Equal(machinistv1.MachineProvisioning), "To": Equal(machinistv1.MachineRunning), "Event": Equal("provisioned"),
		})))
		Expect(condition(machinistv1.ConditionNodeHealthy)(m).Status).To(Equal(metav1.ConditionTrue))
		Expect(m.Finalizers).To(ContainElement(machinistv1.MachineFinalizer))

		By("putting the class's and the Machine's labels and taints on the Node")
		Eventually(func() *corev1.Node { return node(ctx, m.Status.NodeRef.Name) }).Should(And(
			WithTransform(func(n *corev1.Node) map[string]string { return n.Labels }, And(
				HaveKeyWithValue("pool", "blue"), HaveKeyWithValue("machinist.dev/class", "small"))),
			WithTransform(func(n *corev1.Node) []corev1.Taint { return n.Spec.Taints }, ContainElement(
				MatchFields(IgnoreExtras, Fields{"Key": Equal("dedicated"), "Value": Equal("batch"), "Effect": Equal(corev1.TaintEffectNoSchedule)}))),
		))

		By("counting each transition once, and the time spent in each phase left")
		// A transition is counted just after its status write, which the
		// watch may show first.
		Eventually(provisioned).Should(Equal(1.0))
		Eventually(ran).Should(Equal(1.0))
		Eventually(leftPending).Should(Equal(uint64(1)))
		Eventually(leftProvisioning).Should(Equal(uint64(1)))
		// Phase times are measured from stored timestamps, which have
		// whole seconds: one second more than the wall clock at most.
		Expect(inProvisioning()).To(And(BeNumerically(">", 0), BeNumerically("<=", time.Since(started).Seconds()+1)))
	})

	It("counts Machines by phase as the API server stores them", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		newClass(ctx, ns, "broken", &inmemorySpec{FailCreate: "quota exceeded"})
		runMachine(ctx, newMachine(ns, "up", "small"))
		down := newMachine(ns, "down", "broken")
		Expect(k8s.Create(ctx, down)).To(Succeed())
		Eventually(getMachine(ctx, down)).Should(WithTransform(phase, Equal(machinistv1.MachineFailed)))
		// No such class: it waits in Pending.
		waiting := newMachine(ns, "waiting", "missing")
		Expect(k8s.Create(ctx, waiting)).To(Succeed())
		Eventually(getMachine(ctx, waiting)).Should(And(
			WithTransform(phase, Equal(machinistv1.MachinePending)),
			WithTransform(condition(machinistv1.ConditionReady), PointTo(MatchFields(IgnoreExtras, Fields{"Reason": Equal("MachineClassNotFound")}))),
		))

		// The gauge reads the manager's cache, which may lag the API server.
		Eventually(func(g Gomega) {
			g.Expect(machinesByPhase()).To(Equal(listedByPhase(ctx)))
		}).Should(Succeed())
		Expect(machinesByPhase()).To(And(
			HaveKeyWithValue("Running", BeNumerically(">=", 1)),
			HaveKeyWithValue("Failed", BeNumerically(">=", 1)),
			HaveKeyWithValue("Pending", BeNumerically(">=", 1)),
		))

		// A Machine retrying for ever would keep writing through later specs.
		Expect(k8s.Delete(ctx, waiting)).To(Succeed())
		Eventually(isGone(ctx, waiting)).WithTimeout(20 * time.Second).Should(BeTrue())
	})

	It("drains a Machine before deleting it, holding while a PodDisruptionBudget refuses", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "m1", "small"))
		nodeName := m.Status.NodeRef.Name

		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "registry.invalid/agent:1"}}},
				},
			},
		}
		Expect(k8s.Create(ctx, ds)).To(Succeed())
		dsPod := boundPod(ctx, ns, "agent-x", nodeName, map[string]string{"app": "agent"}, &metav1.OwnerReference{
			APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true),
		})
		free := boundPod(ctx, ns, "free", nodeName, map[string]string{"app": "free"}, nil)
		guarded := boundPod(ctx, ns, "guarded", nodeName, map[string]string{"app": "db"}, nil)
		Eventually(func() corev1.PodPhase {
			p := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(guarded), p)).To(Succeed())
			return p.Status.Phase
		}).Should(Equal(corev1.PodRunning), "the node agent runs bound pods")

		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-budget"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			},
		}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		// No disruption controller runs here, so the test plays its part
		// and publishes what the budget allows.
		setAllowed := func(n int32) {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb)).To(Succeed())
			pdb.Status = policyv1.PodDisruptionBudgetStatus{
				ObservedGeneration: pdb.Generation, DisruptionsAllowed: n,
				CurrentHealthy: 1, DesiredHealthy: 1 - n, ExpectedPods: 1,
			}
			Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		}
		setAllowed(0)

		drained := counted(transitionsOf("Running", "Draining", "drain"))
		deleting := counted(transitionsOf("Draining", "Deleting", "delete"))
		deleted := counted(transitionsOf("Deleting", "Deleted", "deleted"))
		leftDraining := counted(durationCount("Draining"))
		inDraining := counted(durationSum("Draining"))
		log := watchPhases(ctx, ns, "m1")
		Expect(k8s.Delete(ctx, m)).To(Succeed())

		By("holding in Draining with the budget named, after evicting the free pod")
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDraining)),
			WithTransform(condition(machinistv1.ConditionDrained), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status": Equal(metav1.ConditionFalse), "Reason": Equal("DisruptionBudget"), "Message": ContainSubstring("db-budget"),
			}))),
		))
		Eventually(podExists(ctx, free)).WithTimeout(20 * time.Second).Should(BeFalse())
		Expect(node(ctx, nodeName).Spec.Unschedulable).To(BeTrue(), "the Node is cordoned")
		Consistently(getMachine(ctx, m), "2s").Should(WithTransform(phase, Equal(machinistv1.MachineDraining)))
		Expect(podExists(ctx, guarded)()).To(BeTrue())

		By("going on once the budget allows a disruption")
		setAllowed(1)
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
		}).WithTimeout(30 * time.Second).Should(BeTrue())
		Expect(podExists(ctx, guarded)()).To(BeFalse())
		Expect(podExists(ctx, dsPod)()).To(BeTrue(), "a drain leaves DaemonSet pods alone")
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: nodeName}, &corev1.Node{}))).To(BeTrue(), "the Node is deleted")
		exists, err := provider.Exists(ctx, m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(exists).To(BeFalse(), "the provider's instance is gone")
		Expect(log.get()).To(Equal([]machinistv1.MachinePhase{machinistv1.MachineRunning, machinistv1.MachineDraining}))

		By("counting the three transitions once each, and the time the budget held the drain")
		Eventually(drained).Should(Equal(1.0))
		Eventually(deleting).Should(Equal(1.0))
		Eventually(deleted).Should(Equal(1.0))
		Eventually(leftDraining).Should(Equal(uint64(1)))
		Expect(inDraining()).To(BeNumerically(">=", 2), "it held in Draining through the 2s Consistently above")
	})

	It("waits for pre-drain hooks before cordoning", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := newMachine(ns, "hooked", "small")
		m.Annotations = map[string]string{machinistv1.PreDrainHookPrefix + "backup": ""}
		m = runMachine(ctx, m)
		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).Should(WithTransform(condition(machinistv1.ConditionDrained), PointTo(
			MatchFields(IgnoreExtras, Fields{"Reason": Equal("PreDrainHook"), "Message": ContainSubstring("backup")}))))
		Consistently(getMachine(ctx, m), "1s").Should(WithTransform(phase, Equal(machinistv1.MachineDraining)))
		Expect(node(ctx, m.Status.NodeRef.Name).Spec.Unschedulable).To(BeFalse())

		held := getMachine(ctx, m)()
		delete(held.Annotations, machinistv1.PreDrainHookPrefix+"backup")
		Expect(k8s.Update(ctx, held)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
		}).WithTimeout(20 * time.Second).Should(BeTrue())
	})

	It("backs off on transient provider errors and recovers", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		provider.FailNext(3)
		log := watchPhases(ctx, ns, "flaky")
		m := runMachine(ctx, newMachine(ns, "flaky", "small"))
		Expect(m.Status.ErrorCount).To(BeZero(), "a transition resets the count")
		Eventually(log.get).Should(Equal([]machinistv1.MachinePhase{
			machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
		}))
		// A retry that read a stale cache loses its status write to a
		// conflict, so not every failed attempt need show; at least one must.
		var most int32
		var reasons []string
		log.mu.Lock()
		for _, s := range log.seen {
			most = max(most, s.Status.ErrorCount)
			if c := condition(machinistv1.ConditionReady)(s); c != nil {
				reasons = append(reasons, c.Reason)
			}
		}
		log.mu.Unlock()
		Expect(most).To(BeNumerically(">=", 1), "failed attempts are counted in status")
		Expect(reasons).To(ContainElement("CreateError"))
	})

	It("fails a Machine on a permanent provider error", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "broken", &inmemorySpec{FailCreate: "quota exceeded"})
		m := newMachine(ns, "doomed", "broken")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineFailed)),
			WithTransform(func(m *machinistv1.Machine) string { r, _ := m.Status.Failure(); return r }, Equal("CreateFailed")),
			WithTransform(func(m *machinistv1.Machine) string { _, msg := m.Status.Failure(); return msg }, ContainSubstring("quota exceeded")),
		))
	})

	It("fails a Machine on a provider error longer than a condition's message may be, keeping its start", func(ctx SpecContext) {
		// A provider may say anything; a message past the schema's bound
		// would make every status write of the Machine fail for ever.
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		long := "quota exceeded: " + strings.Repeat("x", 40000)
		newClass(ctx, ns, "verbose", &inmemorySpec{FailCreate: long})
		m := newMachine(ns, "doomed", "verbose")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(30*time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineFailed)),
			WithTransform(func(m *machinistv1.Machine) string { _, msg := m.Status.Failure(); return msg }, And(
				ContainSubstring("quota exceeded: xxx"), HaveSuffix("..."), HaveLen(machinistv1.MaxMessageLength))),
		), "the Machine failed, with the message cut to its bound")
	})

	It("fails a Machine whose Node never becomes Ready", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "sick", &inmemorySpec{NeverReady: true})
		m := newMachine(ns, "sick-0", "sick")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(provisionTimeout + 10*time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineFailed)),
			WithTransform(func(m *machinistv1.Machine) string { r, _ := m.Status.Failure(); return r }, Equal("ProvisioningTimeout")),
		))
		By("deleting a Failed Machine without a drain")
		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
		}).WithTimeout(20 * time.Second).Should(BeTrue())
	})

	It("shows a crashed machine's expired Lease on the Machine's conditions", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "crashy", "small"))
		Expect(provider.Crash(m.Status.ProviderID)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(
			WithTransform(condition(machinistv1.ConditionNodeHealthy), PointTo(MatchFields(IgnoreExtras, Fields{
				"Status": Equal(metav1.ConditionFalse), "Reason": Equal("NodeLeaseExpired"),
			}))))
		lease := &coordinationv1.Lease{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: m.Status.NodeRef.Name}, lease)).To(Succeed())
		Expect(time.Since(lease.Spec.RenewTime.Time)).To(BeNumerically(">", leaseSeconds*time.Second))
	})
})
