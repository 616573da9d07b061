package qemu_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// fleet is a MachineDeployment of VMs under a running manager.
type fleet struct {
	t   *testing.T
	ctx context.Context
	p   *process.Provider
	dir string
	md  *machinistv1.MachineDeployment
}

// machines lists the fleet's Machines by name.
func (f *fleet) machines(g Gomega) []machinistv1.Machine {
	ms, err := testenv.ListMachines(f.ctx, env.Client, f.md.Namespace, client.MatchingLabels(f.md.Spec.Selector.MatchLabels))
	g.Expect(err).NotTo(HaveOccurred())
	return ms
}

func (f *fleet) node(g Gomega, m machinistv1.Machine) *corev1.Node {
	g.Expect(m.Status.NodeRef).NotTo(BeNil(), "machine %s has no Node yet", m.Name)
	n, err := clientset.CoreV1().Nodes().Get(f.ctx, m.Status.NodeRef.Name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

// state says where the fleet's namespace stands, a line each: its
// Machines (testenv.DescribeMachines), their Nodes' Ready conditions and
// boots, its pods and its last events; what a failed wait needs to say,
// instead of whole objects.
func (f *fleet) state() string {
	ms, err := testenv.ListMachines(f.ctx, env.Client, f.md.Namespace)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	b.WriteString(testenv.DescribeMachines(ms))
	b.WriteString("\n")
	// Every Node of the namespace's VMs, those no Machine has found too.
	nodes, err := clientset.CoreV1().Nodes().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	for _, n := range nodes.Items {
		if ns, _, _, err := providers.ParseProviderID(qemu.Name, n.Spec.ProviderID); err != nil || ns != f.md.Namespace {
			continue
		}
		fmt.Fprintf(&b, "node %s boot %s", n.Name, n.Status.NodeInfo.BootID)
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				fmt.Fprintf(&b, ", Ready=%s since %s: %s", c.Status, c.LastTransitionTime.Format(time.TimeOnly), c.Message)
			}
		}
		for _, t := range n.Spec.Taints {
			fmt.Fprintf(&b, ", taint %s:%s", t.Key, t.Effect)
		}
		b.WriteString("\n")
	}
	pods, err := clientset.CoreV1().Pods(f.md.Namespace).List(f.ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		if p.DeletionTimestamp != nil {
			b.WriteString(", deleting")
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, ", waiting: %s %s", w.Reason, w.Message)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, ", %s=%s %s", c.Type, c.Status, c.Message)
			}
		}
		b.WriteString("\n")
	}
	events, err := clientset.CoreV1().Events(f.md.Namespace).List(f.ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	// Events recorded through events.k8s.io have an event time and no
	// last timestamp.
	at := func(e corev1.Event) time.Time {
		if e.LastTimestamp.IsZero() {
			return e.EventTime.Time
		}
		return e.LastTimestamp.Time
	}
	slices.SortFunc(events.Items, func(a, b corev1.Event) int { return at(a).Compare(at(b)) })
	for _, e := range events.Items[max(0, len(events.Items)-15):] {
		fmt.Fprintf(&b, "event %s %s %s/%s: %s %s\n", at(e).Format(time.TimeOnly), e.Type,
			e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return b.String()
}

// settled waits until the MachineDeployment has its replicas, all of
// the current template, on Ready Nodes, each Machine Running and
// healthy, and returns the Machines with their Nodes.
func (f *fleet) settled(timeout time.Duration) ([]machinistv1.Machine, []*corev1.Node) {
	f.t.Helper()
	var ms []machinistv1.Machine
	var ns []*corev1.Node
	NewWithT(f.t).Eventually(func(g Gomega) {
		md := &machinistv1.MachineDeployment{}
		g.Expect(env.Client.Get(f.ctx, client.ObjectKeyFromObject(f.md), md)).To(Succeed())
		g.Expect(md.Status.ObservedGeneration).To(Equal(md.Generation))
		g.Expect(md.Status.UpdatedReplicas).To(Equal(*md.Spec.Replicas), f.state)
		g.Expect(md.Status.ReadyReplicas).To(Equal(*md.Spec.Replicas), f.state)
		ms = f.machines(g)
		// The count, not the list: a failed wait says f.state, not every
		// field of every Machine.
		g.Expect(len(ms)).To(Equal(int(*md.Spec.Replicas)), f.state)
		ns = ns[:0]
		for _, m := range ms {
			about := func() string { return m.Name + "\n" + f.state() }
			g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning), about)
			g.Expect(m.Spec.Version).To(Equal(md.Spec.Template.Spec.Version), about)
			g.Expect(meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)).To(BeTrue(), about)
			n := f.node(g, m)
			g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal(m.Spec.Version), about)
			ns = append(ns, n)
		}
	}).WithTimeout(timeout).WithPolling(2 * time.Second).Should(Succeed())
	return ms, ns
}

// patch changes the MachineDeployment's spec.
func (f *fleet) patch(change func(*machinistv1.MachineDeployment)) {
	f.t.Helper()
	NewWithT(f.t).Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		md := &machinistv1.MachineDeployment{}
		if err := env.Client.Get(f.ctx, client.ObjectKeyFromObject(f.md), md); err != nil {
			return err
		}
		change(md)
		return env.Client.Update(f.ctx, md)
	})).To(Succeed())
}

// operate asks for an operation on m as the verbs server would, and
// waits until it succeeded; it returns the Machine then.
func (f *fleet) operate(m machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions) machinistv1.Machine {
	f.t.Helper()
	g := NewWithT(f.t)
	operate(g, &m, typ, opts)
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(f.ctx, client.ObjectKeyFromObject(&m), &m)).To(Succeed())
		g.Expect(meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)).To(BeTrue())
	}).WithTimeout(wait).WithPolling(time.Second).Should(Succeed())
	return m
}

// rebootCheck is a MachineHealthCheck of the Machines of labels that
// reboots, one at a time, each whose Node has been Ready=Unknown for
// unknownFor.
func rebootCheck(ns, name string, labels map[string]string, unknownFor time.Duration) *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector:           machinistv1.LabelSelector{MatchLabels: labels},
			NodeStartupTimeout: &metav1.Duration{Duration: 10 * time.Minute},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: unknownFor}},
			},
			MaxUnhealthy: ptr.To(intstr.FromString("100%")),
			Remediation: machinistv1.Remediation{
				Ladder:      []machinistv1.Rung{{Action: machinistv1.RemediateReboot, Timeout: &metav1.Duration{Duration: 5 * time.Minute}}},
				MaxInFlight: ptr.To(intstr.FromInt32(1)),
			},
		},
	}
}

// TestAMachineDeploymentOfVMs runs three VMs under the controllers: a
// rolling upgrade, an in-place update, a soft and a hard reboot, a repair
// that gives a fresh disk, a kill -9 of QEMU healed by the health check,
// and a delete of everything that leaves no QEMU process and no file.
func TestAMachineDeploymentOfVMs(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ctrllog.SetLogger(logr.Discard())
	dir := t.TempDir()
	showConsoles(t, dir)
	p := newProvider(t, dir)
	registry := providers.NewRegistry()
	g.Expect(registry.Register(qemu.Name, p)).To(Succeed())
	ctrls, err := env.StartControllers(manager.Options{
		Actuators:      registry,
		MachineWorkers: 4,
		Backoff:        machinecontroller.Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second},
		DrainPoll:      time.Second,
		NodeGrace:      5 * time.Second,
	}, testenv.Leases{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctrls.Stop(); err != nil {
			t.Error(err)
		}
		// The VMs of a failed test: none may outlive it.
		_ = p.Stop(context.Background())
	})

	ns := env.NewNamespace(t, "vms")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"},
		Spec: machinistv1.MachineClassSpec{Provider: qemu.Name,
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"memory":"256Mi"}`)}},
	}
	g.Expect(env.Client.Create(ctx, class)).To(Succeed())
	labels := map[string]string{"pool": "vms"}
	check := rebootCheck(ns, "vms", labels, 5*time.Second)
	g.Expect(env.Client.Create(ctx, check)).To(Succeed())
	md := &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vms"},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class.Name}, Version: "v1.37.2"},
			},
		},
	}
	g.Expect(env.Client.Create(ctx, md)).To(Succeed())
	f := &fleet{t: t, ctx: ctx, p: p, dir: dir, md: md}
	kernel, err := qemu.FindKernel()
	g.Expect(err).NotTo(HaveOccurred())

	first, nodes := f.settled(6 * time.Minute)
	for _, n := range nodes {
		g.Expect(n.Status.NodeInfo.KernelVersion).To(Equal(kernel.Version))
	}

	// A rolling upgrade: new VMs replace the old ones.
	f.patch(func(md *machinistv1.MachineDeployment) { md.Spec.Template.Spec.Version = "v1.37.3" })
	rolled, _ := f.settled(10 * time.Minute)
	for _, m := range rolled {
		g.Expect(slices.ContainsFunc(first, func(o machinistv1.Machine) bool { return o.UID == m.UID })).To(BeFalse(), "%s is new", m.Name)
	}
	for _, m := range first {
		g.Expect(vms(m.Status.ProviderID)).To(BeEmpty(), "the old VM of %s is gone", m.Name)
	}

	// An in-place update: the same Machines and Nodes boot the new version.
	f.patch(func(md *machinistv1.MachineDeployment) {
		md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy}
		md.Spec.Template.Spec.Version = "v1.38.0"
	})
	inPlace, inPlaceNodes := f.settled(10 * time.Minute)
	for i, m := range inPlace {
		g.Expect(m.UID).To(Equal(rolled[i].UID), "the same Machine")
	}

	// A soft and a hard reboot: new kernel boot IDs, the same disk.
	soft := f.operate(inPlace[0], machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootSoft})
	hard := f.operate(inPlace[1], machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true)})
	for i, m := range []machinistv1.Machine{soft, hard} {
		n := f.node(g, m)
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(inPlaceNodes[i].Status.NodeInfo.BootID), m.Name)
		g.Expect(n.Status.NodeInfo.MachineID).To(Equal(inPlaceNodes[i].Status.NodeInfo.MachineID), "%s kept its disk", m.Name)
	}

	// A repair: a fresh disk, so a new machine ID, and a Node registered
	// afresh.
	repaired := f.operate(inPlace[2], machinistv1.OperationRepair, &machinistv1.OperationOptions{SkipDrain: ptr.To(true)})
	n := f.node(g, repaired)
	g.Expect(n.Status.NodeInfo.MachineID).NotTo(Equal(inPlaceNodes[2].Status.NodeInfo.MachineID), "the disk was wiped")
	g.Expect(n.UID).NotTo(Equal(inPlaceNodes[2].UID), "the Node registered afresh")

	// kill -9 of a QEMU process: a power loss the health check heals
	// with a reboot of the same Machine.
	victim := soft
	before := f.node(g, victim)
	pid, err := p.PID(victim.Status.ProviderID)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var m machinistv1.Machine
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &m)).To(Succeed())
		g.Expect(m.UID).To(Equal(victim.UID))
		g.Expect(m.Status.Remediation).NotTo(BeNil())
		g.Expect(m.Status.Remediation.Phase).To(Equal(machinistv1.RemediationRecovered))
		after := f.node(g, m)
		g.Expect(after.Status.NodeInfo.BootID).NotTo(Equal(before.Status.NodeInfo.BootID))
		g.Expect(meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)).To(BeTrue())
	}).WithTimeout(wait).WithPolling(time.Second).Should(Succeed())

	// Deleting everything leaves no QEMU process and no machine's file.
	all := f.machines(g)
	g.Expect(env.Client.Delete(ctx, md)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(f.machines(g)).To(BeEmpty())
	}).WithTimeout(wait).Should(Succeed())
	for _, m := range append(all, first...) {
		g.Expect(vms(m.Status.ProviderID)).To(BeEmpty(), m.Name)
	}
	left, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	g.Expect(names).To(Equal([]string{"boot"}), "only the provider's initramfs is left in %s", filepath.Base(dir))
}
