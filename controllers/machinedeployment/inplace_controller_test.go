package machinedeployment_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/dev/testenv"
)

func inPlace(maxUnavailable int32, fallback machinistv1.InPlaceFallback) machinistv1.MachineDeploymentStrategy {
	return machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
		InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: ptr.To(intstr.FromInt32(maxUnavailable)), Fallback: fallback}}
}

// fleet follows every Machine event of a namespace: the most Machines
// unavailable at once, and every Machine UID it ever saw.
type fleet struct {
	mu          sync.Mutex
	machines    map[types.UID]*machinistv1.Machine
	seen        map[types.UID]bool
	replicas    int
	unavailable int
}

func watchFleet(ctx context.Context, ns string, replicas int) *fleet {
	events, err := env.WatchMachines(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	f := &fleet{machines: map[types.UID]*machinistv1.Machine{}, seen: map[types.UID]bool{}, replicas: replicas}
	go func() {
		for e := range events {
			m, ok := e.Object.(*machinistv1.Machine)
			if !ok {
				continue
			}
			f.mu.Lock()
			f.seen[m.UID] = true
			if e.Type == watch.Deleted {
				delete(f.machines, m.UID)
			} else {
				f.machines[m.UID] = m
			}
			up := 0
			for _, m := range f.machines {
				if available(m, 0, time.Now()) {
					up++
				}
			}
			// Only once every Machine was up: the scale-up before the
			// rollout is no part of what is measured.
			if len(f.machines) >= f.replicas && f.unavailable >= 0 {
				f.unavailable = max(f.unavailable, f.replicas-up)
			}
			f.mu.Unlock()
		}
	}()
	return f
}

func (f *fleet) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unavailable = 0
}

func (f *fleet) maxUnavailable() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unavailable
}

func (f *fleet) uids() []types.UID {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []types.UID
	for uid := range f.seen {
		out = append(out, uid)
	}
	return out
}

func settled(ctx context.Context, md *machinistv1.MachineDeployment, replicas int32) func(Gomega) {
	return func(g Gomega) {
		got := &machinistv1.MachineDeployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), got)).To(Succeed())
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(machinistv1.RolloutStable))
		g.Expect(got.Status.UpdatedReplicas).To(Equal(replicas))
		g.Expect(got.Status.AvailableReplicas).To(Equal(replicas))
	}
}

var _ = Describe("InPlace rollouts", func() {
	It("updates every Machine where it stands, never more than maxUnavailable down, each once, and hands it to the new MachineSet", func(ctx SpecContext) {
		const replicas = 10
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "ip", replicas, inPlace(2, ""))
		f := watchFleet(ctx, ns, replicas)
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, replicas)).WithTimeout(time.Minute).Should(Succeed())
		before := map[types.UID]machinistv1.Machine{}
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		for _, m := range list.Items {
			before[m.UID] = m
		}
		f.reset()

		setTemplateVersion(ctx, md, "v1.38.0")
		Eventually(settled(ctx, md, replicas)).WithTimeout(2 * time.Minute).Should(Succeed())

		Expect(f.maxUnavailable()).To(BeNumerically("<=", 2), "more Machines down at once than maxUnavailable")
		Expect(f.maxUnavailable()).To(BeNumerically(">=", 1), "the watch saw no Machine go down: did anything update?")
		Expect(f.uids()).To(ConsistOf(keys(before)), "no Machine was created or deleted")
		newHash := machinedeployment.TemplateHash(md.Spec.Template)
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(replicas))
		for _, m := range list.Items {
			was := before[m.UID]
			Expect(m.Name).To(Equal(was.Name))
			Expect(m.Status.NodeRef.Name).To(Equal(was.Status.NodeRef.Name), "the same Node")
			Expect(m.Status.BootID).NotTo(Equal(was.Status.BootID), "a new boot")
			Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
			Expect(m.Status.Operation).NotTo(BeNil())
			Expect(m.Status.Operation.Type).To(Equal(machinistv1.OperationUpdate))
			Expect(m.Status.Operation.State).To(Equal(machinistv1.OperationSucceeded))
			Expect(m.Status.Operation.RequestedBy).To(Equal("machinedeployment/ip"))
			Expect(m.Labels).To(HaveKeyWithValue(machinistv1.TemplateHashLabel, newHash))
			Expect(metav1.GetControllerOf(&m).Name).To(Equal("ip-"+newHash), "owned by the new revision's MachineSet")
			Expect(provider.Restarts(m.Status.ProviderID)).To(Equal(1), "updated exactly once")
		}
		// The hand-over lists are pruned once the Machines have arrived.
		Eventually(func(g Gomega) {
			var sets machinistv1.MachineSetList
			g.Expect(k8s.List(ctx, &sets, client.InNamespace(ns))).To(Succeed())
			for _, ms := range sets.Items {
				g.Expect(ms.Annotations).NotTo(HaveKey(machinistv1.ReleasingAnnotation), ms.Name)
				g.Expect(ms.Annotations).NotTo(HaveKey(machinistv1.ReceivingAnnotation), ms.Name)
			}
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("undoes an in-place rollout in place: the same Machines back on the old version, handed back to the old revision's set", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "undo", 3, inPlace(1, ""))
		f := watchFleet(ctx, ns, 3)
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 3)).WithTimeout(time.Minute).Should(Succeed())
		oldHash := machinedeployment.TemplateHash(md.Spec.Template)
		setTemplateVersion(ctx, md, "v1.38.0")
		Eventually(settled(ctx, md, 3)).WithTimeout(2 * time.Minute).Should(Succeed())
		f.reset()

		setTemplateVersion(ctx, md, "v1.37.1")
		Eventually(settled(ctx, md, 3)).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(f.uids()).To(HaveLen(3), "no Machine was created or deleted")
		Expect(f.maxUnavailable()).To(BeNumerically("<=", 1))
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		for _, m := range list.Items {
			Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.1"))
			Expect(metav1.GetControllerOf(&m).Name).To(Equal("undo-" + oldHash))
			Expect(provider.Restarts(m.Status.ProviderID)).To(Equal(2), "updated there and back, once each")
		}
		var sets machinistv1.MachineSetList
		Expect(k8s.List(ctx, &sets, client.InNamespace(ns))).To(Succeed())
		Expect(sets.Items).To(HaveLen(2), "the old revision's set came back; no copy was made")
	})

	It("stalls at the progress deadline when the provider refuses the updates, and replaces nothing", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		Expect(env.InmemoryClass(ctx, ns, "stale", `{"failUpdate":"no image for v1.38.0"}`)).To(Succeed())
		md := newDeployment(ns, "stuck", 3, inPlace(1, ""))
		md.Spec.Template.Spec.ClassRef.Name = "stale"
		md.Spec.ProgressDeadlineSeconds = ptr.To(int32(10))
		f := watchFleet(ctx, ns, 3)
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 3)).WithTimeout(time.Minute).Should(Succeed())
		setTemplateVersion(ctx, md, "v1.38.0")
		Eventually(func(g Gomega) {
			got := &machinistv1.MachineDeployment{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(machinistv1.RolloutStalled))
			c := findCondition(got.Status.Conditions, machinistv1.ConditionProgressing)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(machinistv1.ReasonProgressDeadlineExceeded))
		}).WithTimeout(time.Minute).Should(Succeed())
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		failed := 0
		for _, m := range list.Items {
			if op := m.Status.Operation; op != nil && op.Type == machinistv1.OperationUpdate && op.State == machinistv1.OperationFailed {
				failed++
				Expect(op.Message).To(ContainSubstring("no image for v1.38.0"))
			}
			Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning), "back in service after the refusal")
		}
		Expect(failed).To(Equal(1), "maxUnavailable 1: one update tried, and it holds the room")
		Expect(f.uids()).To(HaveLen(3), "nothing replaced")
	})

	It("starts nothing new while paused, and finishes once resumed", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		Expect(env.InmemoryClass(ctx, ns, "slow", `{"rebootLatency":"3s"}`)).To(Succeed())
		md := newDeployment(ns, "paused", 4, inPlace(1, ""))
		md.Spec.Template.Spec.ClassRef.Name = "slow"
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 4)).WithTimeout(time.Minute).Should(Succeed())
		asked := func() int {
			var list machinistv1.MachineList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, m := range list.Items {
				if m.Spec.Version == "v1.38.0" {
					n++
				}
			}
			return n
		}
		setTemplateVersion(ctx, md, "v1.38.0")
		Eventually(asked).Should(Equal(1))
		setPaused(ctx, md, true)
		Consistently(asked).WithTimeout(6*time.Second).Should(Equal(1), "an update started while paused")
		setPaused(ctx, md, false)
		Eventually(settled(ctx, md, 4)).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(asked()).To(Equal(4))
	})

	It("scales up during an in-place rollout: the new Machines come from the new template", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		Expect(env.InmemoryClass(ctx, ns, "slow", `{"rebootLatency":"2s"}`)).To(Succeed())
		md := newDeployment(ns, "grow", 3, inPlace(1, ""))
		md.Spec.Template.Spec.ClassRef.Name = "slow"
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 3)).WithTimeout(time.Minute).Should(Succeed())
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		first := map[types.UID]bool{}
		for _, m := range list.Items {
			first[m.UID] = true
		}
		setTemplateVersion(ctx, md, "v1.38.0")
		_, err := env.Kubectl(ctx, "-n", ns, "scale", "machinedeployment", "grow", "--replicas=5")
		Expect(err).NotTo(HaveOccurred())
		Eventually(settled(ctx, md, 5)).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(5))
		kept := 0
		for _, m := range list.Items {
			Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
			if first[m.UID] {
				kept++
			}
		}
		Expect(kept).To(Equal(3), "the first three were updated in place, not replaced")
	})

	It("stops, saying why and replacing nothing, when a change cannot be made in place and the fallback is Never", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		Expect(env.InmemoryClass(ctx, ns, "big", "")).To(Succeed())
		md := newDeployment(ns, "never", 3, inPlace(1, machinistv1.FallbackNever))
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 3)).WithTimeout(time.Minute).Should(Succeed())
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(3))

		setTemplateClass(ctx, md, "big")
		Eventually(func(g Gomega) {
			got := &machinistv1.MachineDeployment{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), got)).To(Succeed())
			c := findCondition(got.Status.Conditions, machinistv1.ConditionProgressing)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("InPlaceNotPossible"))
			g.Expect(c.Message).To(ContainSubstring(`change of machine class that provider "inmemory" cannot apply in place`))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Consistently(func(g Gomega) {
			var now machinistv1.MachineList
			g.Expect(k8s.List(ctx, &now, client.InNamespace(ns))).To(Succeed())
			g.Expect(now.Items).To(HaveLen(3))
			for i := range now.Items {
				g.Expect(now.Items[i].UID).To(Equal(list.Items[i].UID))
				g.Expect(now.Items[i].Spec.ClassRef.Name).To(Equal("small"))
			}
		}).WithTimeout(3 * time.Second).Should(Succeed())
	})

	It("moves no Machine to another cluster in place: a template's new clusterName stops a rollout whose fallback is Never", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small)
		md := newDeployment(ns, "stay", 2, inPlace(1, machinistv1.FallbackNever))
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 2)).WithTimeout(time.Minute).Should(Succeed())
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())

		patchDeployment(ctx, md, func(md *machinistv1.MachineDeployment) { md.Spec.Template.Spec.ClusterName = "elsewhere" })
		Eventually(func(g Gomega) {
			got := &machinistv1.MachineDeployment{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), got)).To(Succeed())
			c := findCondition(got.Status.Conditions, machinistv1.ConditionProgressing)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal("InPlaceNotPossible"))
			g.Expect(c.Message).To(ContainSubstring("moves them from the manager's own cluster to cluster elsewhere, and a Machine never changes cluster"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Consistently(func(g Gomega) {
			var now machinistv1.MachineList
			g.Expect(k8s.List(ctx, &now, client.InNamespace(ns))).To(Succeed())
			g.Expect(now.Items).To(HaveLen(2))
			for i := range now.Items {
				g.Expect(now.Items[i].UID).To(Equal(list.Items[i].UID))
				g.Expect(now.Items[i].Spec.ClusterName).To(BeEmpty())
			}
		}).WithTimeout(3 * time.Second).Should(Succeed())
	})

	It("replaces what cannot change in place, within the in-place bound, when the fallback is Replace", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "deployment", testenv.Small, testenv.Sick)
		Expect(env.InmemoryClass(ctx, ns, "big", "")).To(Succeed())
		md := newDeployment(ns, "replace", 3, inPlace(1, machinistv1.FallbackReplace))
		f := watchFleet(ctx, ns, 3)
		Expect(k8s.Create(ctx, md)).To(Succeed())
		Eventually(settled(ctx, md, 3)).WithTimeout(time.Minute).Should(Succeed())
		f.reset()
		setTemplateClass(ctx, md, "big")
		Eventually(settled(ctx, md, 3)).WithTimeout(2 * time.Minute).Should(Succeed())
		var list machinistv1.MachineList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(3))
		for _, m := range list.Items {
			Expect(m.Spec.ClassRef.Name).To(Equal("big"))
		}
		Expect(f.uids()).To(HaveLen(6), "three replaced")
		Expect(f.maxUnavailable()).To(BeNumerically("<=", 1))
	})
})

// patchDeployment changes md as a person would with kubectl patch.
func patchDeployment(ctx context.Context, md *machinistv1.MachineDeployment, change func(*machinistv1.MachineDeployment)) {
	GinkgoHelper()
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(md), md)).To(Succeed())
	patch := client.MergeFrom(md.DeepCopy())
	change(md)
	Expect(k8s.Patch(ctx, md, patch)).To(Succeed())
}

func setTemplateVersion(ctx context.Context, md *machinistv1.MachineDeployment, version string) {
	GinkgoHelper()
	patchDeployment(ctx, md, func(md *machinistv1.MachineDeployment) { md.Spec.Template.Spec.Version = version })
}

func setTemplateClass(ctx context.Context, md *machinistv1.MachineDeployment, class string) {
	GinkgoHelper()
	patchDeployment(ctx, md, func(md *machinistv1.MachineDeployment) { md.Spec.Template.Spec.ClassRef.Name = class })
}

func setPaused(ctx context.Context, md *machinistv1.MachineDeployment, paused bool) {
	GinkgoHelper()
	patchDeployment(ctx, md, func(md *machinistv1.MachineDeployment) { md.Spec.Paused = paused })
}

func keys(m map[types.UID]machinistv1.Machine) []types.UID {
	var out []types.UID
	for k := range m {
		out = append(out, k)
	}
	return out
}

func findCondition(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}
