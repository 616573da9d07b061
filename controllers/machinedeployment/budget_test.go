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
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var _ = Describe("A rollout under a disruption budget", func() {
	It("holds a rollout the budget does not allow, says so, and replaces old Machines no faster than it allows once it does", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		// maxSurge 4 would replace all four at once.
		md := newDeployment(ns, "pool", 4, rolling(intstr.FromInt32(4), intstr.FromInt32(0)))
		deploy(ctx, md)
		budget := poolBudget(ns, "one-at-a-time", 0, machinistv1.DisruptionRollout)
		Expect(k8s.Create(ctx, budget)).To(Succeed())
		// Disrupted: an old Machine on its way out.
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
		// Held: the new Machines come (maxSurge), no old one goes, and the
		// rollout says why.
		expectHeld(ctx, md, 30*time.Second, "waiting: MachineDisruptionBudget one-at-a-time allows no more disruptions")
		Expect(versions(ctx, ns)).To(HaveKeyWithValue("v1.37.1", 4), "no old Machine deleted")
		Expect(getMD(ctx, md).Status.Phase).To(Equal(machinistv1.RolloutProgressing))

		// Allowed one at a time: it finishes by itself.
		patch := client.MergeFrom(budget.DeepCopy())
		budget.Spec.MaxDisrupted = intstr.FromInt32(1)
		Expect(k8s.Patch(ctx, budget, patch)).To(Succeed())
		waitVersion(ctx, md, "v1.37.2", 4)
		Expect(mon.bad()).To(BeEmpty())
		c := meta.FindStatusCondition(getMD(ctx, md).Status.Conditions, "Progressing")
		Expect(c.Reason).NotTo(Equal("DisruptionHeld"))
		// The old set's Events say what was held.
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
		}).WithTimeout(10 * time.Second).Should(And(
			ContainElement(ContainSubstring("MachineDisruptionBudget one-at-a-time allows no more disruptions")),
			// Once per hold, not once per look every 10 s: at most one
			// while it was 0, and one per old Machine after.
			WithTransform(func(held []string) int { return len(held) }, BeNumerically("<=", 5)),
		))
	})

	It("holds a rollout outside its budget's window, says until when, and resumes by itself when the window opens", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 2, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		// The calendar reads 25 s before a window opens: a whole minute,
		// as cron counts.
		opens := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Minute)
		calendar.Set(opens.Add(-25 * time.Second))
		DeferCleanup(func() { calendar.Set(time.Time{}) })
		budget := poolBudget(ns, "nightly", 1, machinistv1.DisruptionRollout)
		budget.Spec.Windows = []machinistv1.DisruptionWindow{{
			Schedule: fmt.Sprintf("%d %d * * *", opens.Minute(), opens.Hour()), Duration: metav1.Duration{Duration: time.Hour},
		}}
		Expect(k8s.Create(ctx, budget)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(budget), budget)).To(Succeed())
			g.Expect(budget.Status.WindowOpen).To(BeFalse())
			g.Expect(budget.Status.NextWindow).NotTo(BeNil())
			g.Expect(budget.Status.NextWindow.Time).To(BeTemporally("==", opens))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			for _, m := range ms {
				if m.Spec.Version == "v1.37.1" && m.DeletionTimestamp != nil && calendar.Now().Before(opens) {
					return fmt.Sprintf("old Machine %s deleted before the window opened", m.Name)
				}
			}
			return ""
		})
		upgrade(ctx, md, "v1.37.2")
		expectHeld(ctx, md, 20*time.Second, "MachineDisruptionBudget nightly allows no disruption now",
			"waits for its next window, which opens at "+opens.Format(time.RFC3339))
		Expect(calendar.Now()).To(BeTemporally("<", opens), "the hold was seen before the window opened")
		Expect(versions(ctx, ns)).To(HaveKeyWithValue("v1.37.1", 2), "no old Machine deleted")

		// Nobody touches anything: the window opens, and the rollout,
		// which asked to be woken then, finishes.
		waitVersion(ctx, md, "v1.37.2", 2)
		late := calendar.Now().Sub(opens)
		GinkgoWriter.Printf("rollout finished %s after the window opened\n", late.Round(time.Second))
		// Woken when the window opens, not by a poll some time later.
		Expect(late).To(BeNumerically("<", 20*time.Second))
		Expect(mon.bad()).To(BeEmpty())
		Expect(meta.FindStatusCondition(getMD(ctx, md).Status.Conditions, "Progressing").Reason).NotTo(Equal("DisruptionHeld"))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(budget), budget)).To(Succeed())
		Expect(budget.Status.WindowOpen).To(BeTrue())
	})

	It("keeps a rollout, ten reboot requests and a remediation at once within one budget of 2, across a manager restart", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 10, rolling(intstr.FromInt32(3), intstr.FromInt32(0)))
		deploy(ctx, md)
		Expect(k8s.Create(ctx, poolBudget(ns, "two", 2))).To(Succeed())
		Expect(k8s.Create(ctx, &machinistv1.MachineHealthCheck{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
			Spec: machinistv1.MachineHealthCheckSpec{
				Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "pool"}},
				UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
					{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: time.Second}},
					{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: time.Second}},
				},
				Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{{Action: machinistv1.RemediateReplace}}},
			},
		})).To(Succeed())
		// Disrupted as the budget counts it: a Machine that has run and is
		// out of service, on purpose or not. Machines still coming up
		// count for nothing.
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			var out []string
			for _, m := range ms {
				switch m.Status.Phase {
				case "", machinistv1.MachinePending, machinistv1.MachineProvisioning:
					continue
				case machinistv1.MachineRunning:
					if m.DeletionTimestamp == nil && meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady) {
						continue
					}
				}
				out = append(out, fmt.Sprintf("%s %s deleting=%v ready=%v", m.Name, m.Status.Phase, m.DeletionTimestamp != nil,
					meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady)))
			}
			if len(out) > 2 {
				slices.Sort(out)
				return fmt.Sprintf("%d Machines disrupted at once, the budget allows 2: %s", len(out), strings.Join(out, "; "))
			}
			return ""
		})
		old := env.Machines(GinkgoTB(), ns)
		// One Machine breaks: the health check replaces it.
		Expect(provider.Break(old[0].Status.ProviderID)).To(Succeed())
		// Ten reboots asked for by annotation, one per Machine.
		for i := range old {
			m := &old[i]
			patch := client.MergeFrom(m.DeepCopy())
			if m.Annotations == nil {
				m.Annotations = map[string]string{}
			}
			m.Annotations[machinistv1.RequestAnnotation] = "reboot"
			Expect(k8s.Patch(ctx, m, patch)).To(Succeed())
		}
		// And a rolling upgrade.
		upgrade(ctx, md, "v1.37.2")
		// Mid-way, the manager is restarted: what was admitted is in the
		// budget's status, so nothing is admitted twice.
		Eventually(func() []machinistv1.Disruption {
			var b machinistv1.MachineDisruptionBudget
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "two"}, &b)).To(Succeed())
			return b.Status.Disruptions
		}).WithTimeout(time.Minute).ShouldNot(BeEmpty())
		Expect(controllers.RestartManager()).To(Succeed())
		waitVersion(ctx, md, "v1.37.2", 10)
		Expect(mon.bad()).To(BeEmpty())
	})

	It("holds an InPlace rollout's updates the budget does not allow, and says so in the rollout", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 2, inPlace(2, machinistv1.FallbackNever))
		deploy(ctx, md)
		budget := poolBudget(ns, "frozen", 0, machinistv1.DisruptionUpdate)
		Expect(k8s.Create(ctx, budget)).To(Succeed())
		upgrade(ctx, md, "v1.37.2")
		Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(getMD(ctx, md).Status.Conditions, "Progressing")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal("DisruptionHeld"))
			g.Expect(c.Message).To(MatchRegexp(`^Machine \S+'s update is waiting: MachineDisruptionBudget frozen allows no more disruptions`))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		for _, m := range env.Machines(GinkgoTB(), ns) {
			Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning), "nothing drained or updated while held")
		}
		patch := client.MergeFrom(budget.DeepCopy())
		budget.Spec.MaxDisrupted = intstr.FromInt32(1)
		Expect(k8s.Patch(ctx, budget, patch)).To(Succeed())
		// What the Nodes run, not what the Machines ask for.
		Eventually(func() map[string]int {
			out := map[string]int{}
			for _, m := range env.Machines(GinkgoTB(), ns) {
				if m.Status.Phase == machinistv1.MachineRunning && m.Status.NodeInfo != nil {
					out[m.Status.NodeInfo.KubeletVersion]++
				}
			}
			return out
		}).WithTimeout(60 * time.Second).Should(Equal(map[string]int{"v1.37.2": 2}))
	})

	It("replaces Machines past expireAfter one at a time, within the budget", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", 3, rolling(intstr.FromInt32(1), intstr.FromInt32(0)))
		deploy(ctx, md)
		first := map[string]bool{}
		for _, m := range env.Machines(GinkgoTB(), ns) {
			first[m.Name] = true
		}
		budget := poolBudget(ns, "one", 0, machinistv1.DisruptionExpiry)
		Expect(k8s.Create(ctx, budget)).To(Succeed())
		mon := watchRollout(ctx, ns, func(ms map[string]*machinistv1.Machine) string {
			leaving := 0
			for _, m := range ms {
				if m.DeletionTimestamp != nil {
					leaving++
				}
			}
			if leaving > 1 {
				return fmt.Sprintf("%d Machines expiring at once", leaving)
			}
			return ""
		})
		patchSpec(ctx, md, `{"expireAfter":"5s"}`)
		// Held while the budget allows none.
		Eventually(func() []string { return rolloutEvents(ctx, ns, "pool") }).WithTimeout(30 * time.Second).Should(ContainElement("DisruptionHeld"))
		// Said once, not on each look (every 10 s) while it lasts: the
		// Event library writes a repeated Event again as a series.
		Consistently(func(g Gomega) {
			var list eventsv1.EventList
			g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			var held []eventsv1.Event
			for _, e := range list.Items {
				if e.Regarding.Kind == "MachineDeployment" && e.Reason == "DisruptionHeld" {
					held = append(held, e)
				}
			}
			g.Expect(held).To(HaveLen(1))
			g.Expect(held[0].Series).To(BeNil(), "the hold said again")
		}).WithTimeout(12 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(env.Machines(GinkgoTB(), ns)).To(HaveEach(WithTransform(func(m machinistv1.Machine) bool { return first[m.Name] && m.DeletionTimestamp == nil }, BeTrue())))
		patch := client.MergeFrom(budget.DeepCopy())
		budget.Spec.MaxDisrupted = intstr.FromInt32(1)
		Expect(k8s.Patch(ctx, budget, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			ms := env.Machines(GinkgoTB(), ns)
			g.Expect(ms).To(HaveLen(3))
			for _, m := range ms {
				g.Expect(first).NotTo(HaveKey(m.Name), "an original Machine is still there")
				g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
			}
		}).WithTimeout(90 * time.Second).Should(Succeed())
		// Stop the churn before the monitor's last look.
		patchSpec(ctx, md, `{"expireAfter":null}`)
		Expect(mon.bad()).To(BeEmpty())
		Eventually(func() []string { return rolloutEvents(ctx, ns, "pool") }).Should(ContainElement("MachineExpired"))
	})
})

// poolBudget is a budget over the Machines of deployment "pool": max at
// once, for reasons (all when none).
func poolBudget(ns, name string, max int32, reasons ...machinistv1.DisruptionReason) *machinistv1.MachineDisruptionBudget {
	return testenv.Budget(ns, name, "pool", max, reasons...)
}

// expectHeld waits until md's rollout says a disruption budget holds it,
// in words containing each of says.
func expectHeld(ctx context.Context, md *machinistv1.MachineDeployment, within time.Duration, says ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getMD(ctx, md).Status.Conditions, "Progressing")
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal("DisruptionHeld"))
		for _, s := range says {
			g.Expect(c.Message).To(ContainSubstring(s))
		}
	}).WithTimeout(within).Should(Succeed())
}
