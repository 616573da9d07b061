package qemu_test

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// TestAMachineDeploymentOfRealNodes runs two real nodes (the kubelet with
// containerd) as a MachineDeployment: both join by the kubelet's own CSR;
// a Deployment's pods, one on each Node, run in containerd and their logs
// are read through kube-apiserver; a rolling upgrade to a new class
// drains them to the new Nodes, held by a PodDisruptionBudget that allows
// no disruption until it is relaxed, with one pod Running throughout; a
// kill -9 of a QEMU process is healed by the health check's reboot, and
// the lost pod's replacement runs on the new boot; the delete leaves no
// VM.
func TestAMachineDeploymentOfRealNodes(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := startRealNodes(t, manager.Options{MachineWorkers: 4, NodeGrace: 5 * time.Second})

	ns := env.NewNamespace(t, "realfleet")
	// One vCPU each: three VMs share the host's cores during the
	// rollout, and TCG runs a vCPU on a host thread of its own.
	for _, name := range []string{"real-a", "real-b"} {
		g.Expect(env.Client.Create(ctx, &machinistv1.MachineClass{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: machinistv1.MachineClassSpec{Provider: qemu.Name,
				ProviderSpec: runtime.RawExtension{Raw: []byte(`{"cpus":1,"memory":"1Gi","guest":"kubelet"}`)}},
		})).To(Succeed())
	}
	labels := map[string]string{"pool": "real"}
	md := &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "real"},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Strategy: machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy,
				RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "real-a"}, Version: "v1.37.2",
					NodeLabels: machinistv1.NodeLabels{"pool": "real"}},
			},
		},
	}
	g.Expect(env.Client.Create(ctx, md)).To(Succeed())
	f := &fleet{t: t, ctx: ctx, p: p, dir: dir, md: md}
	start := time.Now()
	first, _ := f.settled(realWait)
	t.Logf("two real nodes were Ready %s after the MachineDeployment was made", time.Since(start).Round(100*time.Millisecond))
	for _, m := range first {
		g.Expect(csrs(g, m.Status.NodeRef.Name)).To(Equal(1), "%s joined by its own CSR", m.Name)
	}

	// A Deployment with a pod on each Node, and a budget that allows no
	// disruption.
	app := map[string]string{"app": "marker"}
	g.Expect(env.Client.Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "marker"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(2)), Selector: &metav1.LabelSelector{MatchLabels: app}},
	})).To(Succeed())
	_, err := clientset.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "marker"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: app},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: app},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"pool": "real"},
					AutomountServiceAccountToken:  ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: app}, TopologyKey: corev1.LabelHostname,
						}},
					}},
					Containers: []corev1.Container{{Name: "marker", Image: markerImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	podStart := time.Now()
	var pods []corev1.Pod
	g.Eventually(func(g Gomega) {
		pods = running(g, ns, app)
		g.Expect(len(pods)).To(Equal(2), f.state)
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("the Deployment's two pods were Running %s after it was made", time.Since(podStart).Round(100*time.Millisecond))
	g.Expect([]string{pods[0].Spec.NodeName, pods[1].Spec.NodeName}).To(ConsistOf(first[0].Status.NodeRef.Name, first[1].Status.NodeRef.Name))
	for _, pod := range pods {
		g.Eventually(func(g Gomega) {
			g.Expect(logsOf(g, ns, pod.Name, false)).To(HavePrefix("marker: started in " + pod.Name + "\n"))
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	}

	// Watched throughout the rollout: a pod Running at every look.
	watch, stopWatch := context.WithCancel(ctx)
	var mu sync.Mutex
	fewest := 2
	done := make(chan struct{})
	go func() {
		defer close(done)
		for watch.Err() == nil {
			list, err := clientset.CoreV1().Pods(ns).List(watch, metav1.ListOptions{LabelSelector: "app=marker"})
			if err == nil {
				ready := 0
				for _, pod := range list.Items {
					if isReady(&pod) {
						ready++
					}
				}
				mu.Lock()
				fewest = min(fewest, ready)
				mu.Unlock()
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()

	// A rolling upgrade to the other class: the first old Machine's
	// drain is held by the budget, its pod still Running, until the
	// budget allows one disruption.
	rollout := time.Now()
	f.patch(func(md *machinistv1.MachineDeployment) { md.Spec.Template.Spec.ClassRef.Name = "real-b" })
	var held machinistv1.Machine
	g.Eventually(func(g Gomega) {
		ms := f.machines(g)
		i := slices.IndexFunc(ms, func(m machinistv1.Machine) bool {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionDrained)
			return c != nil && c.Reason == machinistv1.ReasonPodDisruptionBudget
		})
		g.Expect(i).NotTo(Equal(-1), func() string { return "no drain held by the budget\n" + f.state() })
		held = ms[i]
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	g.Expect(held.Spec.ClassRef.Name).To(Equal("real-a"))
	g.Consistently(func(g Gomega) {
		g.Expect(running(g, ns, app)).To(ContainElement(HaveField("Spec.NodeName", held.Status.NodeRef.Name)))
	}).WithTimeout(5 * time.Second).WithPolling(time.Second).Should(Succeed())
	pdb, err := clientset.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "marker", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	pdb.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	_, err = clientset.PolicyV1().PodDisruptionBudgets(ns).Update(ctx, pdb, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	relaxed := time.Now()
	rolled, _ := f.settled(2 * realWait)
	t.Logf("the rollout settled %s after it began, %s after the budget was relaxed",
		time.Since(rollout).Round(100*time.Millisecond), time.Since(relaxed).Round(100*time.Millisecond))
	for _, m := range rolled {
		g.Expect(m.Spec.ClassRef.Name).To(Equal("real-b"))
		g.Expect(slices.ContainsFunc(first, func(o machinistv1.Machine) bool { return o.UID == m.UID })).To(BeFalse(), "%s is new", m.Name)
		g.Expect(csrs(g, m.Status.NodeRef.Name)).To(Equal(1), "%s joined by its own CSR", m.Name)
	}
	for _, m := range first {
		g.Expect(vms(m.Status.ProviderID)).To(BeEmpty(), "the old VM of %s is gone", m.Name)
	}
	g.Eventually(func(g Gomega) {
		pods = running(g, ns, app)
		g.Expect(len(pods)).To(Equal(2), f.state)
		g.Expect([]string{pods[0].Spec.NodeName, pods[1].Spec.NodeName}).To(ConsistOf(rolled[0].Status.NodeRef.Name, rolled[1].Status.NodeRef.Name))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	stopWatch()
	<-done
	g.Expect(fewest).To(BeNumerically(">=", 1), "the budget let both pods go at once")

	// kill -9 of a QEMU process: its Node goes Unknown, and the health
	// check reboots the same Machine (hard, without a drain). The check
	// is made only now: a Node goes Unknown 15 s (the package's grace)
	// after its kubelet's last renewal, and a kubelet starting pods in a
	// VM under emulation, on a host loaded by other tests, has fallen
	// that far behind; a check present all along rebooted such a node in
	// the middle of its pod's start.
	g.Expect(env.Client.Create(ctx, rebootCheck(ns, "real", labels, 30*time.Second))).To(Succeed())
	victim := rolled[0]
	before := f.node(g, victim)
	onVictim := pods[slices.IndexFunc(pods, func(p corev1.Pod) bool { return p.Spec.NodeName == before.Name })]
	pid, err := p.PID(victim.Status.ProviderID)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	killed := time.Now()
	g.Eventually(func(g Gomega) {
		var m machinistv1.Machine
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &m)).To(Succeed())
		g.Expect(m.Status.Remediation).NotTo(BeNil(), f.state)
		g.Expect(m.Status.Remediation.Phase).To(Equal(machinistv1.RemediationRecovered), f.state)
		g.Expect(f.node(g, m).Status.NodeInfo.BootID).NotTo(Equal(before.Status.NodeInfo.BootID), f.state)
		g.Expect(meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)).To(BeTrue(), f.state)
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	// The pod of the dead boot was deleted at once (no kubelet was left
	// to say it ended), and its replacement runs on the new boot: the
	// only Node the anti-affinity leaves it.
	g.Eventually(func(g Gomega) {
		_, err := clientset.CoreV1().Pods(ns).Get(ctx, onVictim.Name, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the dead boot's pod %s", onVictim.Name)
		pods = running(g, ns, app)
		g.Expect(len(pods)).To(Equal(2), f.state)
		g.Expect(pods).To(ContainElement(HaveField("Spec.NodeName", before.Name)))
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	t.Logf("after the kill -9, both pods were Running again %s later", time.Since(killed).Round(100*time.Millisecond))

	// The Deployment and its budget go first: a budget that keeps one
	// pod available holds the last Node's drain for as long as it is
	// there, as it should. Then the MachineDeployment's delete leaves no
	// Machine, no Node and no VM.
	g.Expect(clientset.AppsV1().Deployments(ns).Delete(ctx, "marker", metav1.DeleteOptions{})).To(Succeed())
	g.Expect(clientset.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "marker", metav1.DeleteOptions{})).To(Succeed())
	all := f.machines(g)
	g.Expect(env.Client.Delete(ctx, md)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(len(f.machines(g))).To(BeZero(), f.state)
		for _, m := range all {
			_, err := clientset.CoreV1().Nodes().Get(ctx, m.Status.NodeRef.Name, metav1.GetOptions{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the Node of %s", m.Name)
		}
	}).WithTimeout(realWait).WithPolling(time.Second).Should(Succeed())
	for _, m := range all {
		g.Expect(vms(m.Status.ProviderID)).To(BeEmpty(), "the VM of %s", m.Name)
	}
}

// running lists the Running, Ready pods of the selector's labels.
func running(g Gomega, ns string, labels map[string]string) []corev1.Pod {
	list, err := clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})})
	g.Expect(err).NotTo(HaveOccurred())
	var out []corev1.Pod
	for _, pod := range list.Items {
		if pod.DeletionTimestamp == nil && isReady(&pod) {
			out = append(out, pod)
		}
	}
	return out
}

// isReady reports whether the pod is Running with its Ready condition.
func isReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
