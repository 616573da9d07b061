package machinedeployment_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

func newDeployment(ns, name string, replicas int32, strategy machinistv1.MachineDeploymentStrategy) *machinistv1.MachineDeployment {
	md := testenv.MachineDeployment(ns, name, replicas)
	md.Spec.Strategy = strategy
	md.Spec.Template.Spec.Version = "v1.37.1"
	return md
}

func rolling(surge, unavailable intstr.IntOrString) machinistv1.MachineDeploymentStrategy {
	return machinistv1.MachineDeploymentStrategy{
		Type:          machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable},
	}
}

// available reports whether m has been Ready for minReady at now. The
// controller decided with the same condition time and an earlier clock, so
// this never calls unavailable what the controller counted as available.
func available(m *machinistv1.Machine, minReady time.Duration, now time.Time) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
	return m.DeletionTimestamp.IsZero() && m.Status.Phase == machinistv1.MachineRunning &&
		c != nil && c.Status == metav1.ConditionTrue && !now.Before(c.LastTransitionTime.Add(minReady))
}

// monitor watches every Machine and rollout event of a namespace and
// checks the invariants at each one.
type monitor struct {
	// Watches says why a watch stopped delivering: a monitor that
	// silently stopped would find no violation in what it never saw.
	testenv.Watches
	machines   map[string]*machinistv1.Machine
	phases     []machinistv1.RolloutPhase
	violations []string
	check      func(map[string]*machinistv1.Machine) string
}

func (m *monitor) bad() []string {
	m.Mu.Lock()
	defer m.Mu.Unlock()
	return append(m.Broken(), m.violations...)
}

func (m *monitor) rolloutPhases() []machinistv1.RolloutPhase {
	m.Mu.Lock()
	broken, phases := m.Broken(), slices.Clone(m.phases)
	m.Mu.Unlock()
	Expect(broken).To(BeEmpty(), "a watch failed")
	return phases
}

func watchRollout(ctx context.Context, ns string, check func(map[string]*machinistv1.Machine) string) *monitor {
	mon := &monitor{Watches: testenv.Watches{Recover: GinkgoRecover}, machines: map[string]*machinistv1.Machine{}, check: check}
	for _, m := range env.Machines(GinkgoTB(), ns) {
		mon.machines[m.Name] = m.DeepCopy()
	}
	var md machinistv1.MachineDeploymentList
	Expect(k8s.List(ctx, &md, client.InNamespace(ns))).To(Succeed())
	if len(md.Items) == 1 {
		mon.phases = []machinistv1.RolloutPhase{md.Items[0].Status.Phase}
	}
	events, err := env.WatchMachines(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	rollouts, err := env.Watch(ctx, ns, func() client.ObjectList { return &machinistv1.MachineDeploymentList{} })
	Expect(err).NotTo(HaveOccurred())
	mon.Follow(ctx, "Machine", events, func(ev watch.Event) bool {
		m, ok := ev.Object.(*machinistv1.Machine)
		if !ok {
			return false
		}
		if ev.Type == watch.Deleted {
			delete(mon.machines, m.Name)
		} else {
			mon.machines[m.Name] = m
		}
		if v := mon.check(mon.machines); v != "" {
			mon.violations = append(mon.violations, v)
		}
		return true
	})
	mon.Follow(ctx, "MachineDeployment", rollouts, func(ev watch.Event) bool {
		md, ok := ev.Object.(*machinistv1.MachineDeployment)
		if !ok {
			return false
		}
		if n := len(mon.phases); md.Status.Phase != "" && (n == 0 || mon.phases[n-1] != md.Status.Phase) {
			mon.phases = append(mon.phases, md.Status.Phase)
		}
		return true
	})
	// Whatever a spec checked before, a watch that broke or an invariant
	// broken after its last check still fails it.
	DeferCleanup(func() { Expect(mon.bad()).To(BeEmpty()) })
	return mon
}

// bounds is the rolling update invariant: never more than replicas +
// surge Machines, never fewer than replicas - unavailable available.
func bounds(replicas, surge, unavailable int) func(map[string]*machinistv1.Machine) string {
	return boundsReady(replicas, surge, unavailable, 0)
}

// boundsReady is bounds where a Machine counts as available only after
// being Ready for minReady.
func boundsReady(replicas, surge, unavailable int, minReady time.Duration) func(map[string]*machinistv1.Machine) string {
	return func(ms map[string]*machinistv1.Machine) string {
		avail, now := 0, time.Now()
		for _, m := range ms {
			if available(m, minReady, now) {
				avail++
			}
		}
		switch {
		case len(ms) > replicas+surge:
			return fmt.Sprintf("%d Machines, more than %d", len(ms), replicas+surge)
		case avail < replicas-unavailable:
			return fmt.Sprintf("%d available, fewer than %d", avail, replicas-unavailable)
		}
		return ""
	}
}

// versions counts Running Machines by version, and all others as "other".
func versions(ctx context.Context, ns string) map[string]int {
	out := map[string]int{}
	for _, m := range env.Machines(GinkgoTB(), ns) {
		if m.Status.Phase == machinistv1.MachineRunning && m.DeletionTimestamp.IsZero() {
			out[m.Spec.Version]++
		} else {
			out["other"]++
		}
	}
	return out
}

func getMD(ctx context.Context, md *machinistv1.MachineDeployment) *machinistv1.MachineDeployment {
	out := &machinistv1.MachineDeployment{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), out)).To(Succeed())
	return out
}

func phaseOf(md *machinistv1.MachineDeployment) machinistv1.RolloutPhase { return md.Status.Phase }

// deploy creates md and waits until its Machines run and it is Stable.
func deploy(ctx context.Context, md *machinistv1.MachineDeployment) {
	Expect(k8s.Create(ctx, md)).To(Succeed())
	Eventually(func() map[string]int { return versions(ctx, md.Namespace) }).WithTimeout(60 * time.Second).
		Should(Equal(map[string]int{md.Spec.Template.Spec.Version: int(*md.Spec.Replicas)}))
	Eventually(func() *machinistv1.MachineDeployment { return getMD(ctx, md) }).WithTimeout(30 * time.Second).
		Should(WithTransform(phaseOf, Equal(machinistv1.RolloutStable)))
}

func patchSpec(ctx context.Context, md *machinistv1.MachineDeployment, spec string) {
	Expect(k8s.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":`+spec+`}`)))).To(Succeed())
}

func upgrade(ctx context.Context, md *machinistv1.MachineDeployment, version string) {
	patchSpec(ctx, md, `{"template":{"spec":{"version":"`+version+`"}}}`)
}

func waitVersion(ctx context.Context, md *machinistv1.MachineDeployment, version string, n int) {
	Eventually(func() map[string]int { return versions(ctx, md.Namespace) }).WithTimeout(120 * time.Second).
		Should(Equal(map[string]int{version: n}))
	Eventually(func() *machinistv1.MachineDeployment { return getMD(ctx, md) }).WithTimeout(30 * time.Second).
		Should(WithTransform(phaseOf, Equal(machinistv1.RolloutStable)))
}

// machineReasons lists the Machine controller's Events for one Machine, in order.
func machineReasons(ctx context.Context, ns, name string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	slices.SortFunc(list.Items, func(a, b eventsv1.Event) int { return a.EventTime.Time.Compare(b.EventTime.Time) })
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Machine" && e.Regarding.Name == name && strings.HasPrefix(e.Reason, "Machine") {
			out = append(out, e.Reason)
		}
	}
	return out
}

func sets(ctx context.Context, ns string) []machinistv1.MachineSet {
	var list machinistv1.MachineSetList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	return list.Items
}

var _ = Describe("The MachineDeployment controller", func() {
	DescribeTable("rolls a node upgrade within its bounds",
		func(ctx SpecContext, surge, unavailable intstr.IntOrString, wantSurge, wantUnavailable int) {
			ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
			md := newDeployment(ns, "pool", 6, rolling(surge, unavailable))
			deploy(ctx, md)
			oldNames := []string{}
			for _, m := range env.Machines(GinkgoTB(), ns) {
				oldNames = append(oldNames, m.Name)
			}
			mon := watchRollout(ctx, ns, bounds(6, wantSurge, wantUnavailable))
			upgrade(ctx, md, "v1.37.2")
			waitVersion(ctx, md, "v1.37.2", 6)

			Expect(mon.bad()).To(BeEmpty())
			Eventually(mon.rolloutPhases).Should(Equal([]machinistv1.RolloutPhase{
				machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutStable}))
			for _, name := range oldNames {
				Eventually(func() []string { return machineReasons(ctx, ns, name) }).Should(
					ContainElements("MachineDraining", "MachineDeleting", "MachineDeleted"), name)
			}
			got := getMD(ctx, md)
			Expect(got.Status.UpdatedReplicas).To(BeEquivalentTo(6))
			Expect(got.Status.AvailableReplicas).To(BeEquivalentTo(6))
		},
		Entry("maxSurge 1, maxUnavailable 0", intstr.FromInt32(1), intstr.FromInt32(0), 1, 0),
		Entry("maxSurge 0, maxUnavailable 2", intstr.FromInt32(0), intstr.FromInt32(2), 0, 2),
		Entry("maxSurge 50%, maxUnavailable 25%", intstr.FromString("50%"), intstr.FromString("25%"), 3, 1),
	)

	It("recreates: every old Machine is gone before a new one is created", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "batch", 3, machinistv1.MachineDeploymentStrategy{Type: machinistv1.RecreateStrategy})
		deploy(ctx, md)
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			var oldN, newN int
			for _, m := range ms {
				if m.Spec.Version == "v1.37.2" {
					newN++
				} else {
					oldN++
				}
			}
			if oldN > 0 && newN > 0 {
				return fmt.Sprintf("%d old and %d new Machines at once", oldN, newN)
			}
			return ""
		})
		upgrade(ctx, md, "v1.37.2")
		waitVersion(ctx, md, "v1.37.2", 3)
		Expect(mon.bad()).To(BeEmpty())
	})

	It("on delete: replaces only the Machines someone deletes", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "manual", 3, machinistv1.MachineDeploymentStrategy{Type: machinistv1.OnDeleteStrategy})
		deploy(ctx, md)
		deleted := map[string]bool{} // old Machines seen being deleted
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			replacements := 0
			for _, m := range ms {
				switch {
				case m.Spec.Version == "v1.37.2":
					replacements++
				case !m.DeletionTimestamp.IsZero():
					deleted[m.Name] = true
				}
			}
			if replacements > len(deleted) {
				return fmt.Sprintf("%d new Machines for %d deleted old ones", replacements, len(deleted))
			}
			return ""
		})
		upgrade(ctx, md, "v1.37.2")
		Consistently(func() map[string]int { return versions(ctx, ns) }, "3s").Should(Equal(map[string]int{"v1.37.1": 3}))
		victim := env.Machines(GinkgoTB(), ns)[0]
		Expect(k8s.Delete(ctx, &victim)).To(Succeed())
		Eventually(func() map[string]int { return versions(ctx, ns) }).WithTimeout(60 * time.Second).
			Should(Equal(map[string]int{"v1.37.1": 2, "v1.37.2": 1}))
		Consistently(func() map[string]int { return versions(ctx, ns) }, "3s").Should(Equal(map[string]int{"v1.37.1": 2, "v1.37.2": 1}))
		Expect(mon.bad()).To(BeEmpty())
	})

	It("freezes a paused rollout and finishes it when resumed", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "paused", 6, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		mon := watchRollout(ctx, ns, func(map[string]*machinistv1.Machine) string { return "" })
		upgrade(ctx, md, "v1.37.2")
		Eventually(func() int { return versions(ctx, ns)["v1.37.2"] }).WithTimeout(60 * time.Second).Should(BeNumerically(">=", 2))
		patchSpec(ctx, md, `{"paused":true}`)
		Eventually(mon.rolloutPhases).Should(Equal([]machinistv1.RolloutPhase{
			machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutPaused}))
		specs := func() map[string]int32 {
			out := map[string]int32{}
			for _, ms := range sets(ctx, ns) {
				out[ms.Name] = *ms.Spec.Replicas
			}
			return out
		}
		frozen := specs()
		Consistently(specs, "3s").Should(Equal(frozen), "a paused rollout resizes no MachineSet")
		Expect(frozen).To(HaveLen(2))

		Expect(mon.rolloutPhases()).To(HaveLen(3), "still Paused")

		patchSpec(ctx, md, `{"paused":false}`)
		waitVersion(ctx, md, "v1.37.2", 6)
		Eventually(mon.rolloutPhases).Should(Equal([]machinistv1.RolloutPhase{
			machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutPaused,
			machinistv1.RolloutProgressing, machinistv1.RolloutStable}))
		Eventually(func() []string { return rolloutEvents(ctx, ns, "paused") }).Should(
			ContainElements("RolloutProgressing", "RolloutPaused", "RolloutStable"))
	})

	It("resumes a rollout with nothing to replace straight to Stable", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "idle", 1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		patchSpec(ctx, md, `{"paused":true}`)
		Eventually(func() *machinistv1.MachineDeployment { return getMD(ctx, md) }).Should(WithTransform(phaseOf, Equal(machinistv1.RolloutPaused)))
		patchSpec(ctx, md, `{"paused":false}`)
		// The second RolloutStable is the resume's; a RolloutProgressing
		// fired with it would be recorded by then or within moments.
		Eventually(func() int { return rolloutEventCount(ctx, ns, "idle", "RolloutStable") }).Should(Equal(2))
		Consistently(func() int { return rolloutEventCount(ctx, ns, "idle", "RolloutProgressing") }, "3s").
			Should(Equal(1), "only the first rollout progressed")
		Expect(getMD(ctx, md).Status.Phase).To(Equal(machinistv1.RolloutStable))
	})

	It("scales proportionally when scaled mid-rollout", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "growing", 6, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		mon := watchRollout(ctx, ns, bounds(9, 1, 6)) // never above the new size plus surge, never below the old size
		upgrade(ctx, md, "v1.37.2")
		Eventually(func() int { return versions(ctx, ns)["v1.37.2"] }).WithTimeout(60 * time.Second).Should(BeNumerically(">=", 1))
		patchSpec(ctx, md, `{"paused":true}`)
		Eventually(func() *machinistv1.MachineDeployment { return getMD(ctx, md) }).Should(WithTransform(phaseOf, Equal(machinistv1.RolloutPaused)))
		// Machines still being deleted hold their place against the surge;
		// let them go so that the whole surge is free to share.
		Eventually(func() int {
			deleting := 0
			for _, m := range env.Machines(GinkgoTB(), ns) {
				if !m.DeletionTimestamp.IsZero() {
					deleting++
				}
			}
			return deleting
		}).WithTimeout(30 * time.Second).Should(BeZero())
		before := map[string]int32{}
		for _, ms := range sets(ctx, ns) {
			before[ms.Name] = *ms.Spec.Replicas
		}
		Expect(before).To(HaveLen(2))

		By("scaling 6 to 9 while paused: both sets grow, keeping their ratio")
		patchSpec(ctx, md, `{"replicas":9}`)
		Eventually(func() map[string]int32 {
			out := map[string]int32{}
			for _, ms := range sets(ctx, ns) {
				out[ms.Name] = *ms.Spec.Replicas
			}
			return out
		}).Should(And(
			WithTransform(func(m map[string]int32) int32 {
				var sum int32
				for _, v := range m {
					sum += v
				}
				return sum
			}, BeEquivalentTo(10)),
			HaveEach(BeNumerically(">", 0)),
			Satisfy(func(m map[string]int32) bool {
				for name, v := range m {
					if v <= before[name] {
						return false
					}
				}
				return true
			}),
		))
		patchSpec(ctx, md, `{"paused":false}`)
		waitVersion(ctx, md, "v1.37.2", 9)
		Expect(mon.bad()).To(BeEmpty())
	})

	It("stalls when new Machines never become Ready, removing no old Machine", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "stuck", 3, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		md.Spec.ProgressDeadlineSeconds = ptr.To(int32(5))
		deploy(ctx, md)
		mon := watchRollout(ctx, ns, bounds(3, 1, 0))
		patchSpec(ctx, md, `{"template":{"spec":{"classRef":{"name":"sick"}}}}`)
		Eventually(func() *machinistv1.MachineDeployment { return getMD(ctx, md) }).WithTimeout(30 * time.Second).Should(And(
			WithTransform(phaseOf, Equal(machinistv1.RolloutStalled)),
			WithTransform(func(md *machinistv1.MachineDeployment) string {
				c := meta.FindStatusCondition(md.Status.Conditions, machinistv1.ConditionProgressing)
				if c == nil || c.Status != metav1.ConditionFalse {
					return ""
				}
				return c.Reason
			}, Equal(machinistv1.ReasonProgressDeadlineExceeded)),
		))
		Expect(versions(ctx, ns)).To(Equal(map[string]int{"v1.37.1": 3, "other": 1}), "three old Machines and one new that never came up")
		Expect(mon.bad()).To(BeEmpty())
		Expect(mon.rolloutPhases()).To(Equal([]machinistv1.RolloutPhase{
			machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutStalled}))
	})

	It("honors minReadySeconds and revisionHistoryLimit", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "careful", 2, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		md.Spec.MinReadySeconds = 2
		md.Spec.RevisionHistoryLimit = ptr.To(int32(1))
		deploy(ctx, md)
		mon := watchRollout(ctx, ns, boundsReady(2, 1, 0, 2*time.Second))
		upgrade(ctx, md, "v1.37.2")
		waitVersion(ctx, md, "v1.37.2", 2)
		upgrade(ctx, md, "v1.37.3")
		waitVersion(ctx, md, "v1.37.3", 2)
		Expect(mon.bad()).To(BeEmpty(), "no old Machine went before a new one had been Ready for minReadySeconds")
		Eventually(func() []string {
			var revs []string
			for _, ms := range sets(ctx, ns) {
				revs = append(revs, ms.Annotations[machinistv1.RevisionAnnotation])
			}
			slices.Sort(revs)
			return revs
		}).Should(Equal([]string{"2", "3"}), "revision 1 is pruned, one old revision is kept")
	})

	It("rolls back by reusing the earlier revision's MachineSet", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "back", 2, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		first := sets(ctx, ns)
		Expect(first).To(HaveLen(1))
		upgrade(ctx, md, "v1.37.2")
		waitVersion(ctx, md, "v1.37.2", 2)
		upgrade(ctx, md, "v1.37.1")
		waitVersion(ctx, md, "v1.37.1", 2)
		all := sets(ctx, ns)
		Expect(all).To(HaveLen(2), "no third MachineSet")
		for _, ms := range all {
			if ms.Name == first[0].Name {
				Expect(ms.Annotations[machinistv1.RevisionAnnotation]).To(Equal("3"))
				Expect(*ms.Spec.Replicas).To(BeEquivalentTo(2))
			} else {
				Expect(ms.Annotations[machinistv1.RevisionAnnotation]).To(Equal("2"))
				Expect(*ms.Spec.Replicas).To(BeEquivalentTo(0))
			}
		}
	})

	It("keeps a MachineSet whose hash an earlier release computed", func(ctx SpecContext) {
		// The hash is of the template's Go form, which an API version may
		// change; a set labelled by an earlier release must still be the
		// current one, or an upgrade would replace every Machine.
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "earlier", 2, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		md.Spec.Paused = true
		Expect(k8s.Create(ctx, md)).To(Succeed())
		const hash = "made-by-an-earlier-release"
		ms := testenv.MachineSet(ns, md.Name+"-"+hash, 2)
		ms.Spec.Template = *md.Spec.Template.DeepCopy()
		ms.Spec.Template.Metadata.Labels[machinistv1.TemplateHashLabel] = hash
		ms.Spec.Selector.MatchLabels = map[string]string{"pool": md.Name, machinistv1.TemplateHashLabel: hash}
		ms.Labels = map[string]string{"pool": md.Name, machinistv1.TemplateHashLabel: hash}
		ms.Annotations = map[string]string{machinistv1.RevisionAnnotation: "1"}
		ms.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(md, machinistv1.GroupVersion.WithKind("MachineDeployment"))}
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		Eventually(func() map[string]int { return versions(ctx, ns) }).WithTimeout(60 * time.Second).
			Should(Equal(map[string]int{"v1.37.1": 2}))
		before := map[string]types.UID{}
		for _, m := range env.Machines(GinkgoTB(), ns) {
			before[m.Name] = m.UID
		}

		patchSpec(ctx, md, `{"paused":false}`)
		Eventually(func(g Gomega) {
			got := getMD(ctx, md)
			g.Expect(got.Status.UpdatedReplicas).To(BeEquivalentTo(2))
			g.Expect(got.Status.Phase).To(Equal(machinistv1.RolloutStable))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Consistently(func(g Gomega) {
			all := sets(ctx, ns)
			g.Expect(all).To(HaveLen(1), "no MachineSet made for a template that has one")
			g.Expect(all[0].Name).To(Equal(ms.Name))
			now := map[string]types.UID{}
			for _, m := range env.Machines(GinkgoTB(), ns) {
				now[m.Name] = m.UID
			}
			g.Expect(now).To(Equal(before), "no Machine replaced")
		}).WithTimeout(5 * time.Second).Should(Succeed())
	})
})

// rolloutEventCount is how many times a MachineDeployment's Events of
// reason were recorded: the recorder folds repeats into one Event's
// series.
func rolloutEventCount(ctx context.Context, ns, name, reason string) int {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Kind == "MachineDeployment" && e.Regarding.Name == name && e.Reason == reason {
			if e.Series != nil {
				n += int(e.Series.Count)
			} else {
				n++
			}
		}
	}
	return n
}

// rolloutEvents lists the reasons of a MachineDeployment's Events.
func rolloutEvents(ctx context.Context, ns, name string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "MachineDeployment" && e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}
