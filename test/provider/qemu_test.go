package provider_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/plugin"
)

// qemuProcesses lists the QEMU processes whose command line names dir
// (their initramfs is in it), from /proc.
func qemuProcesses(dir string) []int {
	var pids []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte("qemu-system")) || !bytes.Contains(b, []byte(dir+"/")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// TestAKilledQEMUProviderAdoptsItsVMs kills the qemu provider with kill -9
// while a VM runs, and starts it again: the VM runs on, the new provider
// adopts it, booting nothing twice, and can still reboot and delete it.
func TestAKilledQEMUProviderAdoptsItsVMs(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() {
		// A failed test's VMs must not outlive it.
		for _, pid := range qemuProcesses(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	p := serveOutOfProcess(t, "qemu", append([]string{"--qemu-state-dir", dir}, leaseFlags...)...)
	c, err := p.Dial(plugin.DialOptions{Timeout: 2 * time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "qemu-adopt", Name: "vm", UID: uuid.NewUUID()},
		Spec:       machinistv1.MachineSpec{Version: "v1.37.2"},
	}
	class := &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{Provider: "qemu",
		ProviderSpec: runtime.RawExtension{Raw: []byte(`{"memory":"256Mi"}`)}}}
	id, err := c.Create(ctx, m, class, env.JoinData(t))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { deleteNode(ctx, providers.NodeName(m.Name, m.UID)) })
	boot := nodeBoot(t, providers.NodeName(m.Name, m.UID), "")
	vms := qemuProcesses(dir)
	g.Expect(vms).To(HaveLen(1))

	g.Expect(p.Kill()).To(Succeed())
	g.Expect(qemuProcesses(dir)).To(Equal(vms), "the VM outlives its provider")
	g.Expect(p.Restart()).To(Succeed())
	c2, err := p.Dial(plugin.DialOptions{Timeout: 2 * time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	defer c2.Close()
	inst, err := c2.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	// The owner survives the kill too: it is what keeps another Machine off
	// this VM.
	g.Expect(inst).To(Equal(providers.Instance{Power: providers.PowerOn, BootID: boot, Owner: providers.OwnerOf(m)}))
	g.Consistently(func() []int { return qemuProcesses(dir) }).WithTimeout(5*time.Second).Should(Equal(vms), "adopted, not booted again")

	// The adopted VM is the provider's to reboot and to delete.
	g.Expect(c2.Reboot(ctx, id, providers.Operation{ID: "after-adoption"})).To(Succeed())
	nodeBoot(t, providers.NodeName(m.Name, m.UID), boot)
	g.Expect(c2.Delete(ctx, id)).To(Succeed())
	g.Expect(qemuProcesses(dir)).To(BeEmpty())
}

// nodeBoot waits until Node name is Ready on a boot other than not, and
// returns its boot ID.
func nodeBoot(t *testing.T, name, not string) string {
	t.Helper()
	var boot string
	NewWithT(t).Eventually(func(g Gomega) {
		n, err := kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		boot = n.Status.NodeInfo.BootID
		g.Expect(boot).NotTo(BeEmpty())
		g.Expect(boot).NotTo(Equal(not))
		g.Expect(n.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))))
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return boot
}

func deleteNode(ctx context.Context, name string) {
	_ = kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	_ = kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
}
