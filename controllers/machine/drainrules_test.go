package machine_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// podLog records, per pod, when a watch first showed it terminating (with
// the deletionTimestamp it carried) and when it showed it gone.
type podLog struct {
	mu          sync.Mutex
	terminating map[string]time.Time
	stamp       map[string]time.Time
	gone        map[string]time.Time
}

func watchPods(ctx context.Context, ns string) *podLog {
	events, err := env.Watch(ctx, ns, func() client.ObjectList { return &corev1.PodList{} })
	Expect(err).NotTo(HaveOccurred())
	l := &podLog{terminating: map[string]time.Time{}, stamp: map[string]time.Time{}, gone: map[string]time.Time{}}
	go func() {
		for ev := range events {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			now := time.Now()
			l.mu.Lock()
			if pod.DeletionTimestamp != nil {
				if _, seen := l.terminating[pod.Name]; !seen {
					l.terminating[pod.Name], l.stamp[pod.Name] = now, pod.DeletionTimestamp.Time
				}
			}
			if ev.Type == watch.Deleted {
				l.gone[pod.Name] = now
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// before checks that every pod of first was gone before any pod of then
// was seen terminating, and that their deletion timestamps agree.
func (l *podLog) before(first, then []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range first {
		Expect(l.gone).To(HaveKey(a))
		for _, b := range then {
			Expect(l.terminating).To(HaveKey(b))
			Expect(l.gone[a]).To(BeTemporally("<", l.terminating[b]), "%s was gone before %s was evicted", a, b)
			Expect(l.stamp[a]).To(BeTemporally("<=", l.stamp[b]), "the deletion timestamp of %s is not after %s's", a, b)
		}
	}
}

// writesDuring counts the writes to m that a watch shows over d: a wait
// that nothing changes must cost none.
func writesDuring(ctx context.Context, m *machinistv1.Machine, d time.Duration) int {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	events, err := env.WatchMachines(wctx, m.Namespace)
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for ev := range events {
		if o, ok := ev.Object.(*machinistv1.Machine); ok && o.Name == m.Name {
			n++
		}
	}
	return n
}

// waitsWith matches a Machine whose condition t is False for reason, and
// whose Ready condition says the same: the wait shows in kubectl get.
func waitsWith(t, reason string, message ...string) OmegaMatcher {
	fields := Fields{"Status": Equal(metav1.ConditionFalse), "Reason": Equal(reason)}
	for _, m := range message {
		fields["Message"] = ContainSubstring(m)
	}
	return And(
		WithTransform(condition(t), PointTo(MatchFields(IgnoreExtras, fields))),
		WithTransform(condition(machinistv1.ConditionReady), PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionFalse), "Reason": Equal(reason)}))),
	)
}

func isGoneMachine(ctx context.Context, m *machinistv1.Machine) func() bool {
	return func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
	}
}

func instanceExists(ctx context.Context, id string) func() bool {
	return func() bool {
		ok, err := provider.Exists(ctx, id)
		Expect(err).NotTo(HaveOccurred())
		return ok
	}
}

func runningPod(ctx context.Context, pod *corev1.Pod) {
	Eventually(func() corev1.PodPhase {
		p := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), p)).To(Succeed())
		return p.Status.Phase
	}).WithTimeout(20*time.Second).Should(Equal(corev1.PodRunning), "the node agent runs %s", pod.Name)
}

func volumeAttachment(ctx context.Context, name, nodeName string) *storagev1.VolumeAttachment {
	va, err := env.AttachVolume(ctx, name, nodeName)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8s.Delete(ctx, va))).To(Succeed()) })
	return va
}

var _ = Describe("Drain rules and the waits before an instance goes", func() {
	It("drains in order groups, each gone before the next, and a budget on the middle group holds the last", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := newMachine(ns, "ordered", "small")
		m.Labels = map[string]string{"tier": "data"}
		m = runMachine(ctx, m)
		nodeName := m.Status.NodeRef.Name
		Expect(k8s.Create(ctx, testenv.DrainRule(ns, "proxies-first", machinistv1.DrainBehaviorDrain, ptr.To[int32](-10), nil,
			testenv.PodsLabelled(map[string]string{"app": "proxy"})))).To(Succeed())
		Expect(k8s.Create(ctx, testenv.DrainRule(ns, "databases-last", machinistv1.DrainBehaviorDrain, ptr.To[int32](10),
			map[string]string{"tier": "data"}, testenv.PodsLabelled(map[string]string{"app": "db"})))).To(Succeed())
		// Selects the databases too, but sorts after databases-last.
		Expect(k8s.Create(ctx, testenv.DrainRule(ns, "everything-first", machinistv1.DrainBehaviorDrain, ptr.To[int32](-100), nil,
			testenv.PodsLabelled(map[string]string{"app": "db"})))).To(Succeed())

		proxies, web, dbs := []string{"proxy-0", "proxy-1"}, []string{"web-0", "web-1"}, []string{"db-0", "db-1"}
		var pods []*corev1.Pod
		for _, name := range proxies {
			pods = append(pods, boundPod(ctx, ns, name, nodeName, map[string]string{"app": "proxy"}, nil))
		}
		pods = append(pods, boundPod(ctx, ns, web[0], nodeName, map[string]string{"app": "web"}, nil))
		pods = append(pods, boundPod(ctx, ns, web[1], nodeName, map[string]string{"app": "web", "budget": "held"}, nil))
		for _, name := range dbs {
			pods = append(pods, boundPod(ctx, ns, name, nodeName, map[string]string{"app": "db"}, nil))
		}
		for _, p := range pods {
			runningPod(ctx, p)
		}
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-budget"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"budget": "held"}},
			},
		}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		setAllowed := func(n int32) {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb)).To(Succeed())
			pdb.Status = policyv1.PodDisruptionBudgetStatus{
				ObservedGeneration: pdb.Generation, DisruptionsAllowed: n, CurrentHealthy: 1, DesiredHealthy: 1 - n, ExpectedPods: 1,
			}
			Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		}
		setAllowed(0)
		log := watchPods(ctx, ns)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		By("holding the middle group on its budget, naming the group and the pod")
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDraining)),
			waitsWith(machinistv1.ConditionDrained, machinistv1.ReasonPodDisruptionBudget, "group order 0 (1 more group(s) after it)", ns+"/web-1", "web-budget"),
		))
		Eventually(podExists(ctx, pods[2])).Should(BeFalse(), "web-0, which no budget holds, goes")
		Consistently(func() bool { return podExists(ctx, pods[4])() && podExists(ctx, pods[5])() }, "2s").Should(BeTrue(),
			"the databases wait for the held group")
		Expect(writesDuring(ctx, m, 3*time.Second)).To(BeZero(), "a held drain that nothing changes writes nothing")

		By("going on once the budget allows, the databases last")
		setAllowed(1)
		Eventually(isGoneMachine(ctx, m)).WithTimeout(30 * time.Second).Should(BeTrue())
		log.before(proxies, append(append([]string{}, web...), dbs...))
		log.before(web, dbs)
		Eventually(eventReasons(ctx, m)).Should(ContainElement("DrainPlan"))
		var events []string
		Eventually(func() []string { events = eventMessages(ctx, m, "DrainPlan"); return events }).ShouldNot(BeEmpty())
		Expect(events[0]).To(And(
			ContainSubstring(ns+"/db-0 by MachineDrainRule databases-last over everything-first"),
			ContainSubstring(ns+"/proxy-0 by MachineDrainRule proxies-first"),
		), "the plan says which rule placed which pod, and which rule lost")
	})

	It("evicts nothing while a rule that selects the Machine cannot be read, and drains once it is fixed", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "ruled", "small"))
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, map[string]string{"app": "db"}, nil)
		runningPod(ctx, pod)
		// The schema admits a key that is no label key; the label library
		// does not.
		broken := testenv.DrainRule(ns, "broken", machinistv1.DrainBehaviorSkip, nil, nil, machinistv1.MachineDrainRulePodSelector{
			Selector: &machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{{Key: "app/db/x", Operator: metav1.LabelSelectorOpExists}}},
		})
		Expect(k8s.Create(ctx, broken)).To(Succeed())

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(
			waitsWith(machinistv1.ConditionDrained, machinistv1.ReasonDrainRuleInvalid, "MachineDrainRule broken"))
		Consistently(podExists(ctx, pod), "2s").Should(BeTrue(), "a rule that may keep the pod holds the drain")

		Expect(k8s.Delete(ctx, broken)).To(Succeed())
		Eventually(isGoneMachine(ctx, m)).WithTimeout(30 * time.Second).Should(BeTrue())
		Expect(podExists(ctx, pod)()).To(BeFalse())
	})

	It("leaves a Skip pod through a soft reboot and waits for a WaitCompleted pod to complete", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		batch := env.NewNamespace(GinkgoTB(), "batch")
		nsObj := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: batch}, nsObj)).To(Succeed())
		patch := client.MergeFrom(nsObj.DeepCopy())
		nsObj.Labels["workload"] = "batch"
		Expect(k8s.Patch(ctx, nsObj, patch)).To(Succeed())

		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "keeper", "small"))
		nodeName := m.Status.NodeRef.Name
		Expect(k8s.Create(ctx, &machinistv1.MachineDrainRule{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jobs"},
			Spec: machinistv1.MachineDrainRuleSpec{
				Behavior: machinistv1.DrainBehaviorWaitCompleted,
				Pods: []machinistv1.MachineDrainRulePodSelector{{
					NamespaceSelector: &machinistv1.LabelSelector{MatchLabels: map[string]string{"workload": "batch"}},
				}},
			},
		})).To(Succeed())
		kept := boundPod(ctx, ns, "node-local", nodeName, map[string]string{machinistv1.DrainLabel: "skip"}, nil)
		job := boundPod(ctx, batch, "job-0", nodeName, nil, nil)
		plain := boundPod(ctx, ns, "plain", nodeName, nil, nil)
		for _, p := range []*corev1.Pod{kept, job, plain} {
			runningPod(ctx, p)
		}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(kept), kept)).To(Succeed())
		boot := m.Status.BootID

		annotate(ctx, m, "reboot")
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDraining)),
			waitsWith(machinistv1.ConditionDrained, machinistv1.ReasonWaitCompleted, "1 pod(s) to complete", batch+"/job-0"),
		))
		Eventually(podExists(ctx, plain)).Should(BeFalse())
		Consistently(getMachine(ctx, m), "2s").Should(WithTransform(phase, Equal(machinistv1.MachineDraining)))
		Expect(podExists(ctx, job)()).To(BeTrue(), "a WaitCompleted pod is never evicted")

		By("rebooting once the job's pod has completed")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(job), job)).To(Succeed())
		job.Status.Phase = corev1.PodSucceeded
		Expect(k8s.Status().Update(ctx, job)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		m = getMachine(ctx, m)()
		Expect(m.Status.BootID).NotTo(Equal(boot))
		Expect(condition(machinistv1.ConditionReady)(m).Status).To(Equal(metav1.ConditionTrue))
		after := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(kept), after)).To(Succeed(), "the Skip pod survived the reboot")
		Expect(after.UID).To(Equal(kept.UID))
		Expect(after.DeletionTimestamp).To(BeNil())
	})

	It("deletes the instance only once no VolumeAttachment names the Node, resuming the same wait after a restart", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "attached", "small"))
		va := volumeAttachment(ctx, ns+"-data", m.Status.NodeRef.Name)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDeleting)),
			waitsWith(machinistv1.ConditionVolumesDetached, machinistv1.ReasonVolumeDetach, va.Name),
		))
		began := condition(machinistv1.ConditionVolumesDetached)(getMachine(ctx, m)()).LastTransitionTime
		Consistently(instanceExists(ctx, m.Status.ProviderID), "2s").Should(BeTrue())

		By("resuming the same wait in a new manager")
		Expect(controllers.RestartManager()).To(Succeed())
		// The new manager keeps metrics of its own.
		metrics = controllers.Manager.Metrics
		Consistently(getMachine(ctx, m), "2s").Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDeleting)),
			WithTransform(condition(machinistv1.ConditionVolumesDetached), PointTo(MatchFields(IgnoreExtras, Fields{
				"Reason": Equal(machinistv1.ReasonVolumeDetach), "LastTransitionTime": Equal(began)}))),
		))
		Expect(instanceExists(ctx, m.Status.ProviderID)()).To(BeTrue())

		By("deleting the instance once the attachment is gone")
		Expect(k8s.Delete(ctx, va)).To(Succeed())
		Eventually(isGoneMachine(ctx, m)).WithTimeout(30 * time.Second).Should(BeTrue())
		Expect(instanceExists(ctx, m.Status.ProviderID)()).To(BeFalse())
	})

	It("repairs a Machine only once its volumes are detached, writing nothing while it waits", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "mended", "small"))
		va := volumeAttachment(ctx, ns+"-mended", m.Status.NodeRef.Name)

		annotate(ctx, m, "repair")
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDraining)),
			WithTransform(condition(machinistv1.ConditionDrained), PointTo(MatchFields(IgnoreExtras, Fields{"Status": Equal(metav1.ConditionTrue)}))),
			waitsWith(machinistv1.ConditionVolumesDetached, machinistv1.ReasonVolumeDetach, va.Name),
		))
		Expect(writesDuring(ctx, m, 3*time.Second)).To(BeZero(), "a wait for volumes that nothing changes writes nothing")
		restarts, err := provider.Restarts(m.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		Expect(restarts).To(BeZero(), "not re-imaged under an attached volume")

		Expect(k8s.Delete(ctx, va)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(30 * time.Second).Should(finished(machinistv1.OperationSucceeded))
		Expect(condition(machinistv1.ConditionVolumesDetached)(getMachine(ctx, m)())).To(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionTrue), "Reason": Equal(machinistv1.ReasonVolumesDetached)})))
	})

	It("does not wait for the volumes of a Node whose kubelet is gone", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := runMachine(ctx, newMachine(ns, "dead", "small"))
		volumeAttachment(ctx, ns+"-dead", m.Status.NodeRef.Name)
		Expect(provider.Crash(m.Status.ProviderID)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(
			WithTransform(condition(machinistv1.ConditionNodeHealthy), PointTo(MatchFields(IgnoreExtras, Fields{
				"Reason": Equal(machinistv1.ReasonNodeLeaseExpired)}))))
		events := eventReasons(ctx, m)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(isGoneMachine(ctx, m)).WithTimeout(20 * time.Second).Should(BeTrue())
		Eventually(events).Should(ContainElement(machinistv1.ReasonVolumeDetachSkipped))
	})

	It("gives up on attached volumes after the class's volume-detach timeout, with an Event", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		class := newClass(ctx, ns, "small", nil)
		class.Spec.Drain = &machinistv1.DrainSettings{VolumeDetachTimeout: &metav1.Duration{Duration: 10 * time.Second}}
		Expect(k8s.Update(ctx, class)).To(Succeed())
		m := runMachine(ctx, newMachine(ns, "stuck", "small"))
		volumeAttachment(ctx, ns+"-stuck", m.Status.NodeRef.Name)
		events := eventReasons(ctx, m)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(
			waitsWith(machinistv1.ConditionVolumesDetached, machinistv1.ReasonVolumeDetach))
		waiting := time.Now()
		Eventually(isGoneMachine(ctx, m)).WithTimeout(30 * time.Second).Should(BeTrue())
		Expect(time.Since(waiting)).To(BeNumerically(">=", 9*time.Second), "deleted only once the timeout had passed")
		Expect(instanceExists(ctx, m.Status.ProviderID)()).To(BeFalse())
		Eventually(events).Should(ContainElement(machinistv1.ReasonVolumeDetachTimeout))
	})

	It("holds the instance for a pre-terminate hook, after the drain, until its annotation is removed", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		newClass(ctx, ns, "small", nil)
		m := newMachine(ns, "hooked", "small")
		m.Annotations = map[string]string{machinistv1.PreTerminateHookPrefix + "backup": ""}
		m = runMachine(ctx, m)
		pod := boundPod(ctx, ns, "app", m.Status.NodeRef.Name, nil, nil)
		runningPod(ctx, pod)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(And(
			WithTransform(phase, Equal(machinistv1.MachineDeleting)),
			WithTransform(condition(machinistv1.ConditionReady), PointTo(MatchFields(IgnoreExtras, Fields{
				"Reason": Equal(machinistv1.ReasonPreTerminateHook), "Message": ContainSubstring("backup")}))),
		))
		Expect(podExists(ctx, pod)()).To(BeFalse(), "the drain came first")
		Consistently(instanceExists(ctx, m.Status.ProviderID), "2s").Should(BeTrue())

		held := getMachine(ctx, m)()
		patch := client.MergeFrom(held.DeepCopy())
		delete(held.Annotations, machinistv1.PreTerminateHookPrefix+"backup")
		Expect(k8s.Patch(ctx, held, patch)).To(Succeed())
		Eventually(isGoneMachine(ctx, m)).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(instanceExists(ctx, m.Status.ProviderID)()).To(BeFalse())
	})

	It("finishes a deletion whose Node the API refuses to delete once the node-deletion timeout passes", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "lifecycle")
		class := newClass(ctx, ns, "small", nil)
		class.Spec.Drain = &machinistv1.DrainSettings{NodeDeletionTimeout: &metav1.Duration{Duration: 4 * time.Second}}
		Expect(k8s.Update(ctx, class)).To(Succeed())
		m := newMachine(ns, "kept-node", "small")
		m.Spec.NodeLabels = map[string]string{"lifecycle.test/undeletable": ns}
		m = runMachine(ctx, m)
		nodeName := m.Status.NodeRef.Name
		allow, err := env.RefuseNodeDeletion(ctx, "undeletable-"+ns, "lifecycle.test/undeletable", ns, nodeName)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(allow(ctx)).To(Succeed())
			// kube-apiserver drops the policy a moment after a dry run
			// shows it gone.
			Eventually(func() error {
				return client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}))
			}).WithTimeout(20 * time.Second).Should(Succeed())
		})
		events := eventReasons(ctx, m)

		Expect(k8s.Delete(ctx, m)).To(Succeed())
		Eventually(getMachine(ctx, m)).WithTimeout(20 * time.Second).Should(
			waitsWith(machinistv1.ConditionNodeDeleted, machinistv1.ReasonNodeDeletion, "refused by policy"))
		waiting := time.Now()
		Expect(instanceExists(ctx, m.Status.ProviderID)()).To(BeFalse(), "the instance went first")
		Eventually(isGoneMachine(ctx, m)).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(time.Since(waiting)).To(BeNumerically(">=", 2*time.Second))
		Eventually(events).Should(ContainElement(machinistv1.ReasonNodeDeletionTimeout))
		Expect(node(ctx, nodeName)).NotTo(BeNil(), "the Node the API would not delete is still there")
	})
})

// eventMessages lists the messages of a Machine's Events of one reason.
func eventMessages(ctx context.Context, m *machinistv1.Machine, reason string) []string {
	var out []string
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(m.Namespace))).To(Succeed())
	for _, e := range list.Items {
		if e.Regarding.Name == m.Name && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}
