package machine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// history is what the watches of one namespace showed of each Machine:
// the phases stored in turn, every stored version, whether it was
// removed, and the Events about it. The Events matter because some moves
// are never stored: a Machine deleted before it has an instance goes from
// Pending through Deleting to Deleted within one reconcile, and only its
// Events say which moves it made.
type history struct {
	testenv.Watches
	phases   map[string][]machinistv1.MachinePhase
	versions map[string][]*machinistv1.Machine
	gone     map[string]bool
	events   map[string][]eventsv1.Event
	seen     map[string]bool // Event names, since a series is updated in place
}

// observe starts watching the namespace's Machines and Events; call it
// before anything it should see happens.
func observe(ctx context.Context, ns string) *history {
	h := &history{
		Watches: testenv.Watches{Recover: GinkgoRecover},
		phases:  map[string][]machinistv1.MachinePhase{}, versions: map[string][]*machinistv1.Machine{},
		gone: map[string]bool{}, events: map[string][]eventsv1.Event{}, seen: map[string]bool{},
	}
	machines, err := env.WatchMachines(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	events, err := env.Watch(ctx, ns, func() client.ObjectList { return &eventsv1.EventList{} })
	Expect(err).NotTo(HaveOccurred())
	h.Follow(ctx, "Machine", machines, func(ev watch.Event) bool {
		m, ok := ev.Object.(*machinistv1.Machine)
		if !ok {
			return false
		}
		if ev.Type == watch.Deleted {
			h.gone[m.Name] = true
			return true
		}
		p := m.Status.Phase
		if p == "" {
			p = machinistv1.MachinePending
		}
		if ps := h.phases[m.Name]; len(ps) == 0 || ps[len(ps)-1] != p {
			h.phases[m.Name] = append(ps, p)
		}
		h.versions[m.Name] = append(h.versions[m.Name], m.DeepCopy())
		return true
	})
	h.Follow(ctx, "Event", events, func(ev watch.Event) bool {
		e, ok := ev.Object.(*eventsv1.Event)
		if !ok {
			return false
		}
		if e.Regarding.Kind == "Machine" && !h.seen[e.Name] {
			h.seen[e.Name] = true
			h.events[e.Regarding.Name] = append(h.events[e.Regarding.Name], *e.DeepCopy())
		}
		return true
	})
	return h
}

// lock takes h.Mu for a read, failing the spec if a watch broke.
func (h *history) lock() func() {
	h.Mu.Lock()
	if broken := h.Broken(); len(broken) > 0 {
		h.Mu.Unlock()
		Fail(fmt.Sprintf("a watch failed: %v", broken))
	}
	return h.Mu.Unlock
}

// phasesOf lists the phases name was stored in, in order.
func (h *history) phasesOf(name string) func() []machinistv1.MachinePhase {
	return func() []machinistv1.MachinePhase {
		defer h.lock()()
		return slices.Clone(h.phases[name])
	}
}

// phasesSinceRunning is phasesOf from the first Running on. A Machine
// whose Node is Ready by the time the provider's Create returns goes from
// Pending to Running in one status write (both moves are still in its
// Events, which the specs check), so whether Provisioning was ever stored
// is a matter of timing, not of behaviour.
func (h *history) phasesSinceRunning(name string) func() []machinistv1.MachinePhase {
	return func() []machinistv1.MachinePhase {
		phases := h.phasesOf(name)()
		if i := slices.Index(phases, machinistv1.MachineRunning); i >= 0 {
			return phases[i:]
		}
		return nil
	}
}

// goneOf reports whether the watch saw name removed.
func (h *history) goneOf(name string) func() bool {
	return func() bool {
		defer h.lock()()
		return h.gone[name]
	}
}

// lastOf is the last stored version of name the watch delivered.
func (h *history) lastOf(name string) func() *machinistv1.Machine {
	return func() *machinistv1.Machine {
		defer h.lock()()
		vs := h.versions[name]
		if len(vs) == 0 {
			return &machinistv1.Machine{}
		}
		return vs[len(vs)-1]
	}
}

// storedIn returns every version of name the watch delivered in phase.
func (h *history) storedIn(name string, p machinistv1.MachinePhase) []*machinistv1.Machine {
	defer h.lock()()
	var out []*machinistv1.Machine
	for _, m := range h.versions[name] {
		if m.Status.Phase == p {
			out = append(out, m)
		}
	}
	return out
}

// movesOf lists the transitions the Machine controller announced for name
// in Events, as "From -> To (event)", in the order they happened. Events
// are written concurrently, so the watch may deliver them out of order;
// their eventTime, taken when each was recorded, keeps it.
func (h *history) movesOf(name string) func() []string {
	return func() []string {
		defer h.lock()()
		evs := slices.Clone(h.events[name])
		slices.SortStableFunc(evs, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
		var out []string
		for _, e := range evs {
			if strings.HasPrefix(e.Reason, "Machine") {
				out = append(out, e.Note)
			}
		}
		return out
	}
}

// eventsOf lists name's Events as "Type Reason: Note".
func (h *history) eventsOf(name string) func() []string {
	return func() []string {
		defer h.lock()()
		var out []string
		for _, e := range h.events[name] {
			out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Note))
		}
		return out
	}
}

// nodeLog records the distinct values of one Node's spec.unschedulable in
// the order a watch showed them.
type nodeLog struct {
	testenv.Watches
	unschedulable []bool
}

func watchCordon(ctx context.Context, name string) *nodeLog {
	ch, err := env.Watch(ctx, "", func() client.ObjectList { return &corev1.NodeList{} })
	Expect(err).NotTo(HaveOccurred())
	l := &nodeLog{Watches: testenv.Watches{Recover: GinkgoRecover}, unschedulable: []bool{node(ctx, name).Spec.Unschedulable}}
	l.Follow(ctx, "Node", ch, func(ev watch.Event) bool {
		n, ok := ev.Object.(*corev1.Node)
		if ok && n.Name == name && ev.Type != watch.Deleted && l.unschedulable[len(l.unschedulable)-1] != n.Spec.Unschedulable {
			l.unschedulable = append(l.unschedulable, n.Spec.Unschedulable)
		}
		return ok
	})
	return l
}

func (l *nodeLog) get() []bool {
	l.Mu.Lock()
	broken, out := l.Broken(), slices.Clone(l.unschedulable)
	l.Mu.Unlock()
	Expect(broken).To(BeEmpty(), "the Node watch failed")
	return out
}

// holdWithBudget binds a pod to nodeName behind a PodDisruptionBudget that
// allows no disruption, so any drain of the Node is refused.
func holdWithBudget(ctx context.Context, ns, nodeName string) *corev1.Pod {
	pod := boundPod(ctx, ns, "guarded", nodeName, map[string]string{"app": "db"}, nil)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-budget"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		},
	}
	Expect(k8s.Create(ctx, pdb)).To(Succeed())
	// No disruption controller runs here; the eviction API reads what
	// the budget's status allows, so the test publishes it.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1,
	}
	Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
	return pod
}

// classWith creates an inmemory MachineClass with a providerSpec and
// drain settings.
func classWith(ctx context.Context, ns, name, providerSpec string, drain *machinistv1.DrainSettings) {
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineClassSpec{Provider: "inmemory", Drain: drain},
	}
	if providerSpec != "" {
		class.Spec.ProviderSpec = runtime.RawExtension{Raw: []byte(providerSpec)}
	}
	Expect(k8s.Create(ctx, class)).To(Succeed())
}

func isGone(ctx context.Context, obj client.Object) func() bool {
	return func() bool {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true
		}
		Expect(err).NotTo(HaveOccurred())
		return false
	}
}

func drainedReason(m *machinistv1.Machine) string {
	if c := condition(machinistv1.ConditionDrained)(m); c != nil {
		return c.Reason
	}
	return ""
}

// Phases spelled out once for the long expectations below.
const (
	pending      = machinistv1.MachinePending
	provisioning = machinistv1.MachineProvisioning
	running      = machinistv1.MachineRunning
	draining     = machinistv1.MachineDraining
	rebooting    = machinistv1.MachineRebooting
	repairing    = machinistv1.MachineRepairing
	deleting     = machinistv1.MachineDeleting
	failed       = machinistv1.MachineFailed
)

var upToRunning = []string{"Pending -> Provisioning (provision)", "Provisioning -> Running (provisioned)"}

func moves(ms ...string) []string { return append(slices.Clone(upToRunning), ms...) }

var _ = Describe("Moves of the Machine table", func() {
	It("deletes a Machine that is still Pending: Pending -> Deleting -> Deleted", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Pending", "Deleting", "delete"))
		// Every Create fails, so the Machine stays Pending, retrying.
		provider.FailNext(1 << 20)
		DeferCleanup(provider.FailNext, 0)
		m := newMachine(ns, "early", "small")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		// The first spec to run may meet a manager still starting.
		Eventually(h.lastOf("early")).WithTimeout(10 * time.Second).Should(And(
			WithTransform(phase, Equal(pending)),
			WithTransform(func(m *machinistv1.Machine) int32 { return m.Status.ErrorCount }, BeNumerically(">=", 1)),
			WithTransform(condition(machinistv1.ConditionReady), PointTo(MatchFields(IgnoreExtras, Fields{"Reason": Equal("CreateError")}))),
		))

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(h.goneOf("early")).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(h.phasesOf("early")()).To(Equal([]machinistv1.MachinePhase{pending}))
		// With no instance there is nothing to wait for: both moves happen
		// in one reconcile, so only the Events can show Deleting.
		Eventually(h.movesOf("early")).Should(Equal([]string{"Pending -> Deleting (delete)", "Deleting -> Deleted (deleted)"}))
		Eventually(moved).Should(Equal(1.0))
		Expect(h.lastOf("early")().Status.ProviderID).To(BeEmpty(), "no instance was ever made")
	})

	It("deletes a Machine while it is Provisioning: Provisioning -> Deleting -> Deleted", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "sick", &inmemorySpec{NeverReady: true})
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Provisioning", "Deleting", "delete"))
		m := newMachine(ns, "unready", "sick")
		Expect(k8s.Create(ctx, m)).To(Succeed())
		// The provisioning timeout is 4s: the deletion must land first.
		Eventually(h.phasesOf("unready")).WithTimeout(10 * time.Second).Should(Equal([]machinistv1.MachinePhase{pending, provisioning}))
		providerID := h.lastOf("unready")().Status.ProviderID
		nodeName, err := provider.NodeName(providerID)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Name: nodeName}, &corev1.Node{}) }).Should(Succeed())

		// Two refused Deletes keep the Machine in Deleting across a status
		// write, so that the watch can see the phase; otherwise the
		// instance goes in the same reconcile and Deleting is never stored.
		provider.FailNext(2)
		DeferCleanup(provider.FailNext, 0)
		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(h.goneOf("unready")).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(h.phasesOf("unready")()).To(Equal([]machinistv1.MachinePhase{pending, provisioning, deleting}))
		Eventually(h.movesOf("unready")).Should(Equal([]string{
			"Pending -> Provisioning (provision)", "Provisioning -> Deleting (delete)", "Deleting -> Deleted (deleted)"}))
		Eventually(moved).Should(Equal(1.0))
		exists, err := provider.Exists(ctx, providerID)
		Expect(err).NotTo(HaveOccurred())
		Expect(exists).To(BeFalse())
		Eventually(isGone(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})).Should(BeTrue())
	})

	It("deletes a Machine while it is Repairing, failing the repair: Repairing -> Deleting -> Deleted", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Repairing", "Deleting", "delete"))
		m := runMachine(ctx, newMachine(ns, "mending", "slow"))
		// A pod to evict makes the drain last past a status write, so
		// that Draining is stored and shows on the watch.
		boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)
		op := request(ctx, m, machinistv1.OperationRepair, nil)
		// The operation timeout is 5s: the deletion must land first.
		Eventually(h.phasesSinceRunning("mending")).WithTimeout(20 * time.Second).Should(Equal([]machinistv1.MachinePhase{
			running, draining, repairing}))

		// As above: two refused Deletes make Deleting a stored phase.
		provider.FailNext(2)
		DeferCleanup(provider.FailNext, 0)
		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(h.goneOf("mending")).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(h.phasesSinceRunning("mending")()).To(Equal([]machinistv1.MachinePhase{
			running, draining, repairing, deleting}))
		Eventually(h.movesOf("mending")).Should(Equal(moves(
			"Running -> Draining (drain)", "Draining -> Repairing (repair)",
			"Repairing -> Deleting (delete)", "Deleting -> Deleted (deleted)")))
		Eventually(moved).Should(Equal(1.0))
		stored := h.storedIn("mending", deleting)
		Expect(stored).NotTo(BeEmpty())
		Expect(stored[0].Status.Operation).To(PointTo(MatchFields(IgnoreExtras, Fields{
			"ID": Equal(op.ID), "State": Equal(machinistv1.OperationFailed), "Message": Equal("the Machine is being deleted"),
		})))
		Eventually(h.eventsOf("mending")).Should(ContainElement(HavePrefix("Warning OperationFailed: repair " + op.ID)))
	})

	It("fails a repair whose Machine does not come back in time: Repairing -> Failed", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: time.Minute}})
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Repairing", "Failed", "fail"))
		inRepairing := counted(durationSum("Repairing"))
		m := runMachine(ctx, newMachine(ns, "lost", "slow"))
		boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil) // so that Draining is stored, as above
		op := request(ctx, m, machinistv1.OperationRepair, nil)
		Eventually(h.phasesSinceRunning("lost")).WithTimeout(30 * time.Second).Should(Equal([]machinistv1.MachinePhase{
			running, draining, repairing, failed}))
		Expect(h.lastOf("lost")()).To(And(
			WithTransform(func(m *machinistv1.Machine) string { r, _ := m.Status.Failure(); return r }, Equal(machinistv1.FailureRepairTimeout)),
			WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{
				"ID": Equal(op.ID), "State": Equal(machinistv1.OperationFailed), "Message": ContainSubstring("no Ready Node with a new boot ID"),
			}))),
		))
		Eventually(h.movesOf("lost")).Should(Equal(moves(
			"Running -> Draining (drain)", "Draining -> Repairing (repair)", "Repairing -> Failed (fail)")))
		Eventually(moved).Should(Equal(1.0))
		// The suite's operation timeout is 5s; phase times count from the
		// stored, whole-second transition time, as the deadline does.
		Eventually(inRepairing).Should(BeNumerically(">=", 5))
	})

	It("repairs a Failed Machine that has an instance, without a drain: Failed -> Repairing -> Running", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		// The machine stays off 3s after a restart: long after the reboot's
		// timeoutSeconds (1s) fails it, well within the suite's 5s operation
		// timeout for the repair that follows.
		newClass(ctx, ns, "slow", &inmemorySpec{RebootLatency: metav1.Duration{Duration: 3 * time.Second}})
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Failed", "Repairing", "repair"))
		m := runMachine(ctx, newMachine(ns, "revived", "slow"))
		boot, nodeUID := m.Status.BootID, m.Status.NodeRef.UID
		request(ctx, m, machinistv1.OperationReboot, &machinistv1.OperationOptions{TimeoutSeconds: ptr.To(int64(1))})
		Eventually(h.lastOf("revived")).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(failed)),
			WithTransform(func(m *machinistv1.Machine) string { r, _ := m.Status.Failure(); return r }, Equal(machinistv1.FailureRebootTimeout)),
		))

		By("repairing it: the provider re-images the instance, no drain comes first")
		op := request(ctx, m, machinistv1.OperationRepair, &machinistv1.OperationOptions{Reason: "did not come back"})
		Eventually(h.lastOf("revived")).WithTimeout(20 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		Expect(h.phasesSinceRunning("revived")()).To(Equal([]machinistv1.MachinePhase{
			running, rebooting, failed, repairing, running}))
		Eventually(h.movesOf("revived")).Should(Equal(moves(
			"Running -> Draining (drain)", "Draining -> Rebooting (reboot)", "Rebooting -> Failed (fail)",
			"Failed -> Repairing (repair)", "Repairing -> Running (repaired)")))
		Eventually(moved).Should(Equal(1.0))

		By("clearing the failure as it leaves Failed, and recording a new boot on a Node registered afresh")
		left := h.storedIn("revived", repairing)
		Expect(left).NotTo(BeEmpty())
		Expect(left[0].Status).To(MatchFields(IgnoreExtras, Fields{
			"LastTransition": PointTo(MatchFields(IgnoreExtras, Fields{"From": Equal(failed), "Event": Equal("repair")})),
		}))
		Expect(left[0].Status.Failure()).To(BeEmpty(), "a Machine that left Failed says no failure")
		last := h.lastOf("revived")()
		Expect(last.Status.Operation).To(PointTo(MatchFields(IgnoreExtras, Fields{
			"ID": Equal(op.ID), "State": Equal(machinistv1.OperationSucceeded), "Message": HavePrefix("repaired: boot ID"),
		})))
		Expect(last.Status.Failure()).To(BeEmpty())
		Expect(last.Status.BootID).NotTo(Equal(boot))
		Expect(last.Status.NodeRef.UID).NotTo(Equal(nodeUID), "the Node was registered afresh")
		Expect(condition(machinistv1.ConditionReady)(last)).To(PointTo(MatchFields(IgnoreExtras, Fields{"Status": Equal(metav1.ConditionTrue)})))
		Expect(condition(machinistv1.ConditionDrained)(last)).To(BeNil())
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(Equal(2), "the reboot, then the repair")
		Eventually(func() bool { return node(ctx, last.Status.NodeRef.Name).Spec.Unschedulable }).Should(BeFalse())
	})

	It("aborts a drain whose operation record is gone: Draining -> Running, uncordoned", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Draining", "Running", "abort"))
		m := runMachine(ctx, newMachine(ns, "forgot", "small"))
		nodeName := m.Status.NodeRef.Name
		cordon := watchCordon(ctx, nodeName)
		guarded := holdWithBudget(ctx, ns, nodeName)
		request(ctx, m, machinistv1.OperationReboot, nil)
		Eventually(h.lastOf("forgot")).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(draining)), WithTransform(drainedReason, Equal("DisruptionBudget"))))
		Eventually(cordon.get).Should(Equal([]bool{false, true}))

		By("clearing status.operation by hand while the budget holds the drain")
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := getMachine(ctx, m)()
			cur.Status.Operation = nil
			return k8s.Status().Update(ctx, cur)
		})).To(Succeed())

		Eventually(h.phasesSinceRunning("forgot")).WithTimeout(20 * time.Second).Should(Equal([]machinistv1.MachinePhase{
			running, draining, running}))
		Eventually(cordon.get).Should(Equal([]bool{false, true, false}))
		Eventually(h.movesOf("forgot")).Should(Equal(moves("Running -> Draining (drain)", "Draining -> Running (abort)")))
		Eventually(moved).Should(Equal(1.0))
		Expect(h.lastOf("forgot")()).To(And(
			WithTransform(condition(machinistv1.ConditionDrained), BeNil()),
			WithTransform(operationOf, BeNil()),
		))
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(BeZero(), "the provider was never asked")
		Expect(podExists(ctx, guarded)()).To(BeTrue())
	})
})

var _ = Describe("Reboots and the drain", func() {
	DescribeTable("reboots anyway once the drain timeout passes while a budget refuses, saying so", func(ctx SpecContext, classTimeout, machineTimeout time.Duration) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		drain := func(d time.Duration) *machinistv1.DrainSettings {
			if d == 0 {
				return nil
			}
			return &machinistv1.DrainSettings{Timeout: &metav1.Duration{Duration: d}}
		}
		classWith(ctx, ns, "patient", "", drain(classTimeout))
		h := observe(ctx, ns)
		m := newMachine(ns, "late", "patient")
		m.Spec.Drain = drain(machineTimeout)
		m = runMachine(ctx, m)
		boot := m.Status.BootID
		cordon := watchCordon(ctx, m.Status.NodeRef.Name)
		guarded := holdWithBudget(ctx, ns, m.Status.NodeRef.Name)
		op := request(ctx, m, machinistv1.OperationReboot, nil)

		Eventually(h.phasesSinceRunning("late")).WithTimeout(30 * time.Second).Should(Equal([]machinistv1.MachinePhase{
			running, draining, rebooting, running}))
		Expect(h.lastOf("late")()).To(And(
			WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{"ID": Equal(op.ID), "State": Equal(machinistv1.OperationSucceeded)}))),
			WithTransform(func(m *machinistv1.Machine) string { return m.Status.BootID }, Not(Equal(boot))),
		))

		By("holding in Draining while the budget refused, for the timeout and no less")
		held := h.storedIn("late", draining)
		Expect(held).To(ContainElement(WithTransform(drainedReason, Equal("DisruptionBudget"))))
		rebooted := h.storedIn("late", rebooting)
		Expect(rebooted).NotTo(BeEmpty())
		entered, left := held[0].Status.LastTransition.Time, rebooted[0].Status.LastTransition.Time
		Expect(left.Sub(entered.Time)).To(BeNumerically(">=", 3*time.Second))

		By("recording the timeout in the Drained condition and a Warning Event")
		Expect(condition(machinistv1.ConditionDrained)(rebooted[0])).To(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status":  Equal(metav1.ConditionFalse),
			"Reason":  Equal("DrainTimeout"),
			"Message": And(ContainSubstring("drain timeout 3s passed; rebooting anyway"), ContainSubstring("db-budget")),
		})))
		Eventually(h.eventsOf("late")).Should(ContainElement(HavePrefix("Warning DrainTimeout: drain timeout 3s passed; rebooting anyway")))
		Expect(podExists(ctx, guarded)()).To(BeTrue(), "the budget's pod was never evicted")
		Eventually(cordon.get).Should(Equal([]bool{false, true, false}), "cordoned for the drain, uncordoned after the reboot")
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(Equal(1))
	},
		Entry("the class's timeout, the Machine setting none", 3*time.Second, time.Duration(0)),
		Entry("the Machine's timeout over its class's", time.Hour, 3*time.Second),
	)

	DescribeTable("gives up a drain a pre-drain hook holds past the operation's timeoutSeconds: Draining -> Running, Failed",
		func(ctx SpecContext, typ machinistv1.OperationType, verb string) {
			ns := env.NewNamespace(GinkgoTB(), "lifecycle")
			newClass(ctx, ns, "small", nil)
			h := observe(ctx, ns)
			moved := counted(transitionsOf("Draining", "Running", "abort"))
			m := newMachine(ns, "hooked", "small")
			m.Annotations = map[string]string{machinistv1.PreDrainHookPrefix + "x": ""}
			m = runMachine(ctx, m)
			boot := m.Status.BootID
			cordon := watchCordon(ctx, m.Status.NodeRef.Name)
			op := request(ctx, m, typ, &machinistv1.OperationOptions{TimeoutSeconds: ptr.To(int64(2))})
			Eventually(h.lastOf("hooked")).Should(And(
				WithTransform(phase, Equal(draining)), WithTransform(drainedReason, Equal("PreDrainHook"))))

			// Without timeoutSeconds the hook would hold it in Draining for ever.
			Eventually(h.phasesSinceRunning("hooked")).WithTimeout(20 * time.Second).Should(Equal([]machinistv1.MachinePhase{
				running, draining, running}))
			Eventually(h.movesOf("hooked")).Should(Equal(moves("Running -> Draining (drain)", "Draining -> Running (abort)")))
			Eventually(moved).Should(Equal(1.0))
			last := h.lastOf("hooked")()
			Expect(last.Status.Operation).To(PointTo(MatchFields(IgnoreExtras, Fields{
				"ID":    Equal(op.ID),
				"State": Equal(machinistv1.OperationFailed),
				"Message": Equal("the " + verb + "'s timeout of 2s passed while draining: " +
					"waiting for pre-drain hook annotation(s) to be removed: [pre-drain.hook.machinist.dev/x]"),
			})))
			Expect(condition(machinistv1.ConditionDrained)(last)).To(BeNil())
			Expect(last.Status.Phase).To(Equal(running))
			Expect(last.Status.Failure()).To(BeEmpty(), "the operation failed, not the Machine")
			Expect(last.Status.BootID).To(Equal(boot))
			Expect(last.Annotations).To(HaveKey(machinistv1.PreDrainHookPrefix+"x"), "the hook is its owner's to remove")

			By("giving up at the timeout and no sooner")
			// Both times are stored in whole seconds, and the deadline is
			// counted from the stored startedAt, so the difference is exact
			// at its low end.
			took := last.Status.Operation.CompletedAt.Sub(last.Status.Operation.StartedAt.Time)
			// The upper bound leaves room for a loaded machine.
			Expect(took).To(And(BeNumerically(">=", 2*time.Second), BeNumerically("<=", 10*time.Second)))
			Eventually(h.eventsOf("hooked")).Should(ContainElement(HavePrefix("Warning OperationFailed: " + verb + " " + op.ID)))
			restarts, err := provider.Restarts(m.Status.ProviderID)
			Expect(err).NotTo(HaveOccurred())
			Expect(restarts).To(BeZero(), "the provider was never asked")
			// The hook comes before the cordon, so the Node was never cordoned.
			Consistently(cordon.get, "500ms").Should(Equal([]bool{false}))
		},
		Entry("a reboot", machinistv1.OperationReboot, "reboot"),
		Entry("a repair", machinistv1.OperationRepair, "repair"),
	)

	It("aborts a reboot the provider refuses for good: Draining -> Running, Failed, uncordoned", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "locked", &inmemorySpec{FailReboot: "host locked"})
		h := observe(ctx, ns)
		moved := counted(transitionsOf("Draining", "Running", "abort"))
		m := runMachine(ctx, newMachine(ns, "refused", "locked"))
		cordon := watchCordon(ctx, m.Status.NodeRef.Name)
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)
		op := request(ctx, m, machinistv1.OperationReboot, nil)

		Eventually(h.phasesSinceRunning("refused")).WithTimeout(30 * time.Second).Should(Equal([]machinistv1.MachinePhase{
			running, draining, running}))
		Expect(h.lastOf("refused")()).To(And(
			WithTransform(operationOf, PointTo(MatchFields(IgnoreExtras, Fields{
				"ID":      Equal(op.ID),
				"State":   Equal(machinistv1.OperationFailed),
				"Message": And(HavePrefix("the provider refused: "), ContainSubstring("host locked")),
			}))),
			WithTransform(condition(machinistv1.ConditionDrained), BeNil()),
		))
		Eventually(h.movesOf("refused")).Should(Equal(moves("Running -> Draining (drain)", "Draining -> Running (abort)")))
		Eventually(moved).Should(Equal(1.0))
		Eventually(h.eventsOf("refused")).Should(ContainElement(HavePrefix("Warning OperationFailed: reboot " + op.ID)))
		// Cordoned for the drain and uncordoned by the abort, once: a
		// reconcile woken by the uncordon must not act on a cached Machine
		// older than the abort it stored (drain again, ask the provider
		// again).
		Eventually(cordon.get).Should(Equal([]bool{false, true, false}), "cordoned for the drain, uncordoned by the abort")
		Consistently(cordon.get, "1s").Should(Equal([]bool{false, true, false}), "and never again")
		Consistently(func() bool { return node(ctx, m.Status.NodeRef.Name).Spec.Unschedulable }, "1s").Should(BeFalse())
		Expect(podExists(ctx, pod)()).To(BeFalse(), "the drain ran before the provider was asked")
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(BeZero())
		Expect(m.Status.BootID).To(Equal(h.lastOf("refused")().Status.BootID), "the machine never restarted")
	})
})
