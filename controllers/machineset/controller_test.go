package machineset_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

func newSet(ns, name string, replicas int32, policy machinistv1.DeletePolicy) *machinistv1.MachineSet {
	ms := testenv.MachineSet(ns, name, replicas)
	ms.Spec.DeletePolicy = policy
	return ms
}

func names(ms []machinistv1.Machine) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// phases returns each Machine's phase, empty counting as Pending.
func phases(ctx context.Context, ns string) []machinistv1.MachinePhase {
	var out []machinistv1.MachinePhase
	for _, m := range env.Machines(GinkgoTB(), ns) {
		p := m.Status.Phase
		if p == "" {
			p = machinistv1.MachinePending
		}
		out = append(out, p)
	}
	return out
}

func waitRunning(ctx context.Context, ns string, n int) []machinistv1.Machine {
	Eventually(func() []machinistv1.MachinePhase { return phases(ctx, ns) }).WithTimeout(60 * time.Second).
		Should(And(HaveLen(n), HaveEach(machinistv1.MachineRunning)))
	return env.Machines(GinkgoTB(), ns)
}

func scale(ctx context.Context, ns, name string, n int) {
	_, err := env.Kubectl(ctx, "-n", ns, "scale", "machineset", name, fmt.Sprintf("--replicas=%d", n))
	Expect(err).NotTo(HaveOccurred())
}

// transitionReasons lists, in order, the Events the Machine controller
// recorded for one Machine.
func transitionReasons(ctx context.Context, ns, machine string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var evs []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Machine" && e.Regarding.Name == machine && strings.HasPrefix(e.Reason, "Machine") {
			evs = append(evs, e)
		}
	}
	slices.SortFunc(evs, func(a, b eventsv1.Event) int { return a.EventTime.Time.Compare(b.EventTime.Time) })
	var out []string
	for _, e := range evs {
		out = append(out, e.Reason)
	}
	return out
}

// scaleDownAndCheck scales the set to keep Machines and checks that
// exactly want were removed, each through Draining and Deleting.
func scaleDownAndCheck(ctx context.Context, ns, name string, keep int, want []string) {
	scale(ctx, ns, name, keep)
	Eventually(func() []string { return names(env.Machines(GinkgoTB(), ns)) }).WithTimeout(30 * time.Second).
		Should(HaveLen(keep))
	left := names(env.Machines(GinkgoTB(), ns))
	for _, gone := range want {
		Expect(left).NotTo(ContainElement(gone))
		Eventually(func() []string { return transitionReasons(ctx, ns, gone) }).Should(ContainElements(
			"MachineDraining", "MachineDeleting", "MachineDeleted"))
		reasons := transitionReasons(ctx, ns, gone)
		Expect(slices.Index(reasons, "MachineDraining")).To(BeNumerically("<", slices.Index(reasons, "MachineDeleting")))
		Expect(slices.Index(reasons, "MachineDeleting")).To(BeNumerically("<", slices.Index(reasons, "MachineDeleted")))
	}
}

// growOneBySecond scales the set up one Machine at a time, a second apart,
// so that creation timestamps (second resolution) order the Machines.
func growOneBySecond(ctx context.Context, ns, name string, n int) []string {
	var order []string
	for i := 1; i <= n; i++ {
		scale(ctx, ns, name, i)
		Eventually(func() []machinistv1.Machine { return env.Machines(GinkgoTB(), ns) }).Should(HaveLen(i))
		var newest time.Time
		for _, m := range env.Machines(GinkgoTB(), ns) {
			if !slices.Contains(order, m.Name) {
				order = append(order, m.Name)
			}
			if t := m.CreationTimestamp.Time; t.After(newest) {
				newest = t
			}
		}
		// The next Machine must be created in a later second than this one.
		testenv.WaitFor(GinkgoTB(), 2*time.Second, "the clock past the newest Machine's second", func() bool {
			return time.Now().Truncate(time.Second).After(newest)
		})
	}
	waitRunning(ctx, ns, n)
	return order
}

var _ = Describe("The MachineSet controller", func() {
	It("scales with kubectl from 0 to 5 and back to 2", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "workers", 0, machinistv1.DeleteRandom))).To(Succeed())
		scale(ctx, ns, "workers", 5)
		all := waitRunning(ctx, ns, 5)
		for _, m := range all {
			Expect(metav1.GetControllerOf(&m).Name).To(Equal("workers"))
			Expect(m.Finalizers).To(ContainElement(machinistv1.MachineFinalizer), "set at creation")
		}
		Eventually(func() string {
			out, err := env.Kubectl(ctx, "-n", ns, "get", "ms", "workers", "--no-headers")
			Expect(err).NotTo(HaveOccurred())
			f := strings.Fields(out)
			return strings.Join(f[:min(5, len(f))], " ")
		}).Should(Equal("workers 5 5 5 5"))

		scale(ctx, ns, "workers", 2)
		Eventually(func() []string { return names(env.Machines(GinkgoTB(), ns)) }).WithTimeout(30 * time.Second).Should(HaveLen(2))
		for _, m := range all {
			if !slices.Contains(names(env.Machines(GinkgoTB(), ns)), m.Name) {
				// The recorder sends Events in the background, after the
				// transitions they report: the Machine can be gone first.
				Eventually(func() []string { return transitionReasons(ctx, ns, m.Name) }).
					Should(ContainElements("MachineDraining", "MachineDeleting", "MachineDeleted"))
			}
		}
		Eventually(func() int32 {
			ms := &machinistv1.MachineSet{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "workers"}, ms)).To(Succeed())
			return ms.Status.Replicas
		}).Should(BeEquivalentTo(2))
	})

	It("removes the oldest Machines first under the Oldest policy", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "old", 0, machinistv1.DeleteOldest))).To(Succeed())
		order := growOneBySecond(ctx, ns, "old", 4)
		scaleDownAndCheck(ctx, ns, "old", 2, order[:2])
	})

	It("removes the newest Machines first under the Newest policy", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "new", 0, machinistv1.DeleteNewest))).To(Succeed())
		order := growOneBySecond(ctx, ns, "new", 4)
		scaleDownAndCheck(ctx, ns, "new", 2, order[2:])
	})

	It("removes some Machines under the Random policy", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "rnd", 4, machinistv1.DeleteRandom))).To(Succeed())
		waitRunning(ctx, ns, 4)
		scaleDownAndCheck(ctx, ns, "rnd", 1, nil)
		Consistently(func() []machinistv1.Machine { return env.Machines(GinkgoTB(), ns) }, "2s").Should(HaveLen(1))
	})

	It("removes a Machine marked for deletion before the policy's choice", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "marked", 0, machinistv1.DeleteOldest))).To(Succeed())
		order := growOneBySecond(ctx, ns, "marked", 3)
		newest := &machinistv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: order[2]}, newest)).To(Succeed())
		newest.Annotations = map[string]string{machinistv1.DeleteMachineAnnotation: "yes"}
		Expect(k8s.Update(ctx, newest)).To(Succeed())
		scaleDownAndCheck(ctx, ns, "marked", 2, order[2:])
	})

	It("removes a Failed Machine before the policy's choice", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "failing", 0, machinistv1.DeleteOldest))).To(Succeed())
		order := growOneBySecond(ctx, ns, "failing", 2)
		provider.SetFaults(inmemoryFailCreate)
		DeferCleanup(func() { provider.SetFaults(noFaults) })
		scale(ctx, ns, "failing", 3)
		var failed string
		Eventually(func() string {
			for _, m := range env.Machines(GinkgoTB(), ns) {
				if m.Status.Phase == machinistv1.MachineFailed {
					failed = m.Name
				}
			}
			return failed
		}).ShouldNot(BeEmpty())
		provider.SetFaults(noFaults)
		scaleDownAndCheck(ctx, ns, "failing", 2, nil)
		Expect(names(env.Machines(GinkgoTB(), ns))).To(ConsistOf(order[0], order[1]), "the Failed Machine went, not the oldest")
	})

	It("adopts matching orphans and releases Machines that stop matching", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		orphan := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan", Labels: map[string]string{"pool": "adopter"}},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
		}
		Expect(k8s.Create(ctx, orphan)).To(Succeed())
		// Running means the manager's cache has seen it, so the set's
		// first reconcile finds it; otherwise the set would rightly create
		// two Machines and remove a surplus one later.
		waitRunning(ctx, ns, 1)
		Expect(k8s.Create(ctx, newSet(ns, "adopter", 2, machinistv1.DeleteRandom))).To(Succeed())
		all := waitRunning(ctx, ns, 2)
		Expect(names(all)).To(ContainElement("orphan"), "the orphan counts toward replicas")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(orphan), orphan)).To(Succeed())
		Expect(metav1.GetControllerOf(orphan)).NotTo(BeNil())
		Expect(metav1.GetControllerOf(orphan).Name).To(Equal("adopter"))
		Eventually(func() []string { return setEvents(ctx, ns, "adopter") }).Should(ContainElement("Adopted"))

		By("releasing it when its labels change, and replacing it")
		orphan.Labels = map[string]string{"pool": "elsewhere"}
		Expect(k8s.Update(ctx, orphan)).To(Succeed())
		Eventually(func() *metav1.OwnerReference {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(orphan), orphan)).To(Succeed())
			return metav1.GetControllerOf(orphan)
		}).Should(BeNil())
		Eventually(func() []string { return setEvents(ctx, ns, "adopter") }).Should(ContainElement("Released"))
		waitRunning(ctx, ns, 3)
	})

	It("never creates more Machines than asked for while scale-ups race its cache", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		var mu sync.Mutex
		target, seen, most := 0, map[string]bool{}, 0
		violations := []string{}
		events, err := env.WatchMachines(ctx, ns)
		Expect(err).NotTo(HaveOccurred())
		go func() {
			defer GinkgoRecover()
			for ev := range events {
				m, ok := ev.Object.(*machinistv1.Machine)
				if !ok {
					mu.Lock()
					violations = append(violations, fmt.Sprintf("the watch failed: %v", ev.Object))
					mu.Unlock()
					continue
				}
				mu.Lock()
				if ev.Type == watch.Deleted {
					delete(seen, m.Name)
				} else {
					seen[m.Name] = true
				}
				most = max(most, len(seen))
				if len(seen) > target {
					violations = append(violations, fmt.Sprintf("%d Machines with replicas at most %d", len(seen), target))
				}
				mu.Unlock()
			}
		}()
		ms := newSet(ns, "burst", 0, machinistv1.DeleteRandom)
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		for _, n := range []int{3, 7, 12, 20, 26, 33, 41, 50} {
			mu.Lock()
			target = n // raised before the write, so the bound is never too tight
			mu.Unlock()
			patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
			Expect(k8s.Patch(ctx, ms, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
		}
		waitRunning(ctx, ns, 50)
		Consistently(func() int { return len(env.Machines(GinkgoTB(), ns)) }, "2s").Should(Equal(50))
		Eventually(func() int {
			mu.Lock()
			defer mu.Unlock()
			return most
		}).WithTimeout(30*time.Second).Should(Equal(50), "the watch has seen every Machine")
		mu.Lock()
		defer mu.Unlock()
		Expect(violations).To(BeEmpty())
		Expect(most).To(Equal(50))
	})

	It("replaces a deleted Machine", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		Expect(k8s.Create(ctx, newSet(ns, "healing", 3, machinistv1.DeleteRandom))).To(Succeed())
		before := waitRunning(ctx, ns, 3)
		victim := before[0]
		Expect(k8s.Delete(ctx, &victim)).To(Succeed())
		Eventually(func() []string { return names(env.Machines(GinkgoTB(), ns)) }).WithTimeout(30 * time.Second).
			ShouldNot(ContainElement(victim.Name))
		after := waitRunning(ctx, ns, 3)
		Expect(names(after)).To(ContainElements(before[1].Name, before[2].Name))
	})

	It("counts a Machine available only after minReadySeconds", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
		ms := newSet(ns, "patient", 2, machinistv1.DeleteRandom)
		ms.Spec.MinReadySeconds = 3
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		get := func() machinistv1.MachineSetStatus {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
			return ms.Status
		}
		Eventually(get).WithTimeout(30 * time.Second).Should(And(
			HaveField("ReadyReplicas", BeEquivalentTo(2)), HaveField("AvailableReplicas", BeEquivalentTo(0))))
		Eventually(get).WithTimeout(10 * time.Second).Should(HaveField("AvailableReplicas", BeEquivalentTo(2)))
		Expect(get().Selector).To(Equal("pool=patient"))
		Expect(get().ObservedGeneration).To(Equal(ms.Generation))
	})
})

func setEvents(ctx context.Context, ns, set string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "MachineSet" && e.Regarding.Name == set {
			out = append(out, e.Reason)
		}
	}
	return out
}
