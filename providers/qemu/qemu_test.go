package qemu_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

var (
	env       *testenv.Env
	clientset kubernetes.Interface
	// guestBinary is the machinist binary built for this run, each VM's
	// init.
	guestBinary string
	// nodeDir holds what a real node's guest holds (testenv.EnsureNode).
	nodeDir string
)

func TestMain(m *testing.M) {
	// A VM under emulation on a busy host may renew its Lease late: the
	// node lifecycle controller gives it a Lease duration and more.
	opts := testenv.Options{ControllerManager: true, Scheduler: true, Workloads: true, NodeMonitorGracePeriod: 15 * time.Second}
	os.Exit(testenv.RunWithOptions(m, opts, func(e *testenv.Env) (func(), error) {
		env = e
		clientset = kubernetes.NewForConfigOrDie(e.Config)
		dir, err := os.MkdirTemp("", "machinist-qemu-test-")
		if err != nil {
			return nil, err
		}
		guestBinary = filepath.Join(dir, "machinist")
		if nodeDir, err = testenv.EnsureNode(); err != nil {
			return func() { _ = os.RemoveAll(dir) }, err
		}
		return func() { _ = os.RemoveAll(dir) }, testenv.Build("./cmd/machinist", guestBinary)
	}))
}

// Boots under TCG take seconds; the wait is for a loaded 2-core host.
const (
	leaseSeconds = 10
	renew        = 2 * time.Second
	wait         = 3 * time.Minute
)

func newProvider(t *testing.T, dir string) *process.Provider {
	t.Helper()
	p, err := qemu.New(qemu.Options{
		StateDir:             dir,
		GuestBinary:          guestBinary,
		LeaseDurationSeconds: leaseSeconds,
		RenewInterval:        renew,
		Log:                  zap.New(zap.WriteTo(testWriter{t})),
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// showConsoles logs a digest of every VM's console (digest) when the
// test failed.
func showConsoles(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "*", "*.log*"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", l, digest(string(b)))
		}
	})
}

// digest is what a console says that a failure needs: a real node's
// console runs to thousands of lines of containerd and the kubelet, and
// CI keeps only a part of a test's output. It is every line of init's
// and the kernel's that tells a boot, a stop or a fault, the last errors
// of the daemons, and the last lines.
func digest(console string) string {
	lines := strings.Split(strings.TrimRight(console, "\n"), "\n")
	if len(lines) <= 60 {
		return console
	}
	var told, errs []string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "machinist: "), kernelNews.MatchString(l):
			told = append(told, l)
		case daemonError.MatchString(l):
			errs = append(errs, l)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "(%d lines; init's and the kernel's news:)\n", len(lines))
	b.WriteString(strings.Join(told[max(0, len(told)-40):], "\n"))
	fmt.Fprintf(&b, "\n(the last of %d errors:)\n", len(errs))
	b.WriteString(strings.Join(errs[max(0, len(errs)-15):], "\n"))
	b.WriteString("\n(the last lines:)\n")
	b.WriteString(strings.Join(lines[len(lines)-15:], "\n"))
	return b.String()
}

var (
	kernelNews  = regexp.MustCompile(`\] (reboot: |Kernel panic|Out of memory|oom-kill|clocksource|tsc: |EXT4-fs error|I/O error)`)
	daemonError = regexp.MustCompile(`^E\d{4} |ERRO|level=error|"level":"error"`)
)

func machine(name string) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "vm", Name: name, UID: uuid.NewUUID()},
		Spec:       machinistv1.MachineSpec{Version: "v1.37.2"},
	}
}

// booted waits until the instance's Node is Ready with a boot ID other
// than notBootID, and returns it.
func booted(t *testing.T, p *process.Provider, providerID, notBootID string) *corev1.Node {
	t.Helper()
	name, err := p.NodeName(providerID)
	if err != nil {
		t.Fatal(err)
	}
	var n *corev1.Node
	NewWithT(t).Eventually(func(g Gomega) {
		var err error
		n, err = clientset.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Status.NodeInfo.BootID).NotTo(BeEmpty())
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(notBootID))
		g.Expect(n.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))))
	}).WithTimeout(wait).WithPolling(time.Second).Should(Succeed())
	return n
}

// vms lists the live QEMU processes of providerID, from /proc.
func vms(providerID string) []int {
	var pids []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if bytes.HasPrefix(b, []byte("qemu-system")) || bytes.Contains(b, []byte("/qemu-system")) {
			if bytes.Contains(b, []byte(" --provider-id="+providerID+" ")) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// csrs counts the certificate requests made for the Node name: one per
// join.
func csrs(g Gomega, node string) int {
	list, err := clientset.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, c := range list.Items {
		block, _ := pem.Decode(c.Spec.Request)
		g.Expect(block).NotTo(BeNil())
		req, err := x509.ParseCertificateRequest(block.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		if c.Spec.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName && req.Subject.CommonName == "system:node:"+node {
			n++
		}
	}
	return n
}

// TestAMachineLivesItsOwnLife boots a VM and carries it through its life:
// the Node reports the guest kernel, a soft and a hard reboot each give
// a new kernel boot ID, an update boots the new version on the same Node,
// a repair gives it a fresh disk (it joins again), a provider that went
// away without stopping it adopts it without booting it twice, a kill -9
// of QEMU is a power loss a reboot heals, and delete leaves nothing.
func TestAMachineLivesItsOwnLife(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	showConsoles(t, dir)
	p := newProvider(t, dir)
	m := machine("life")
	class := &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{
		Provider:     qemu.Name,
		ProviderSpec: runtime.RawExtension{Raw: []byte(`{"cpus":1,"memory":"256Mi"}`)},
	}}
	id, err := p.Create(ctx, m, class, env.JoinData(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(id).To(HavePrefix("qemu:///vm/life/"))
	n := booted(t, p, id, "")
	kernel := filepath.Base(qemuKernel(t))
	g.Expect(n.Status.NodeInfo.KernelVersion).To(Equal(strings.TrimPrefix(kernel, "vmlinuz-")))
	g.Expect(n.Status.NodeInfo.OSImage).To(ContainSubstring("Machinist guest"))
	g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
	g.Expect(n.Status.Capacity.Memory().String()).To(Equal("256Mi"))
	inst, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst).To(Equal(providers.Instance{Power: providers.PowerOn, BootID: n.Status.NodeInfo.BootID, Owner: providers.OwnerOf(m)}))
	g.Expect(vms(id)).To(HaveLen(1))
	joins := csrs(g, n.Name)
	g.Expect(joins).To(Equal(1))

	// A soft reboot: Ctrl-Alt-Del, an orderly restart in the guest.
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "soft"})).To(Succeed())
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "soft"})).To(Succeed())
	soft := booted(t, p, id, n.Status.NodeInfo.BootID)
	g.Expect(csrs(g, n.Name)).To(Equal(joins), "the disk kept the Node's credentials")
	g.Expect(n.Status.NodeInfo.MachineID).To(HaveLen(32))
	g.Expect(soft.Status.NodeInfo.MachineID).To(Equal(n.Status.NodeInfo.MachineID), "the disk kept the machine ID")
	g.Expect(restarts(g, p, id)).To(Equal(1))
	// The boot before's console: the guest's init stopped its agent.
	machineDir := filepath.Join(dir, "vm_life_"+string(m.UID))
	g.Expect(lastConsole(g, machineDir)).To(ContainSubstring("machinist: init: stopping the agent"))

	// A hard one: QMP system_reset.
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "hard", Hard: true})).To(Succeed())
	hard := booted(t, p, id, soft.Status.NodeInfo.BootID)
	g.Expect(csrs(g, n.Name)).To(Equal(joins))
	g.Expect(lastConsole(g, machineDir)).NotTo(ContainSubstring("stopping the agent"), "a reset gives no chance to stop")

	// An update boots the new version on the same Node.
	g.Expect(p.Update(ctx, id, providers.Operation{ID: "update", Version: "v1.37.3"})).To(Succeed())
	var updated *corev1.Node
	g.Eventually(func(g Gomega) {
		updated = booted(t, p, id, hard.Status.NodeInfo.BootID)
		g.Expect(updated.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.3"))
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(updated.UID).To(Equal(n.UID))

	// A provider gone without stopping its VMs: the next adopts them.
	pids := vms(id)
	g.Expect(pids).To(HaveLen(1))
	again := newProvider(t, dir)
	g.Expect(again.TakeOver(ctx)).To(Succeed())
	g.Expect(vms(id)).To(Equal(pids), "adopted, not booted twice")
	inst, err = again.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst.BootID).To(Equal(updated.Status.NodeInfo.BootID))
	p = again

	// A repair re-images the disk: the machine joins afresh.
	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "repair", Join: env.JoinData(t)})).To(Succeed())
	repaired := booted(t, p, id, updated.Status.NodeInfo.BootID)
	g.Expect(repaired.UID).NotTo(Equal(n.UID), "the Node registered afresh")
	g.Expect(csrs(g, n.Name)).To(Equal(joins+1), "the new disk held no credentials")
	g.Expect(repaired.Status.NodeInfo.MachineID).NotTo(Equal(n.Status.NodeInfo.MachineID), "a fresh disk, a new machine ID")

	// kill -9 of QEMU is a power loss; a reboot brings the machine back.
	pids = vms(id)
	g.Expect(pids).To(HaveLen(1))
	g.Expect(syscall.Kill(pids[0], syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() providers.Power {
		inst, _ := p.Describe(ctx, id)
		return inst.Power
	}).WithTimeout(10 * time.Second).Should(Equal(providers.PowerOff))
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "heal", Hard: true})).To(Succeed())
	booted(t, p, id, repaired.Status.NodeInfo.BootID)

	// Delete leaves no process and no file.
	g.Expect(p.Delete(ctx, id)).To(Succeed())
	g.Expect(vms(id)).To(BeEmpty())
	left, _ := filepath.Glob(filepath.Join(dir, "vm_life_*"))
	g.Expect(left).To(BeEmpty())
}

// lastConsole is the serial console of the machine's boot before this one.
func lastConsole(g Gomega, machineDir string) string {
	b, err := os.ReadFile(filepath.Join(machineDir, "console.log.1"))
	g.Expect(err).NotTo(HaveOccurred())
	return string(b)
}

func restarts(g Gomega, p *process.Provider, id string) int {
	n, err := p.Restarts(id)
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

func qemuKernel(t *testing.T) string {
	k, err := qemu.FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	return k.Image
}

// A machine that can never boot is refused before anything is made; one
// that can no longer boot (its guest binary replaced by one too big)
// stays off after a provider restart, without failing the takeover and
// with it every call for every machine.
func TestAMachineThatCannotBootBlocksNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	showConsoles(t, dir)
	p := newProvider(t, dir)
	bad := &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{Provider: qemu.Name,
		ProviderSpec: runtime.RawExtension{Raw: []byte(`{"memory":"256Mi","disk":"1Gi"}`)}}}
	_, err := p.Create(ctx, machine("refused"), bad, env.JoinData(t))
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring(`unknown field "disk"`)))
	left, _ := filepath.Glob(filepath.Join(dir, "vm_refused_*"))
	g.Expect(left).To(BeEmpty())

	id, err := p.Create(ctx, machine("outgrown"), nil, env.JoinData(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, p, id, "")
	g.Expect(p.Stop(ctx)).To(Succeed())

	// The next provider's guest binary does not fit 256 MiB.
	big := filepath.Join(t.TempDir(), "machinist")
	f, err := os.Create(big)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.Truncate(200 << 20)).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
	again, err := qemu.New(qemu.Options{StateDir: dir, GuestBinary: big})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.TakeOver(ctx)).To(Succeed())
	inst, err := again.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(inst.Power).To(Equal(providers.PowerOff))
	err = again.Reboot(ctx, id, providers.Operation{ID: "r1"})
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring("does not fit")))
	g.Expect(again.Delete(ctx, id)).To(Succeed())
	g.Expect(vms(id)).To(BeEmpty())
}
