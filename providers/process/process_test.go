package process_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/nodeagent"
	"github.com/machinist-dev/machinist/providers/process"
)

var (
	env       *testenv.Env
	clientset kubernetes.Interface
	// agentBinary is the machinist binary built for this run.
	agentBinary string
)

func TestMain(m *testing.M) {
	// Kubernetes' node lifecycle controller marks a killed machine's Node
	// NotReady, as in a cluster.
	os.Exit(testenv.RunWithOptions(m, testenv.Options{ControllerManager: true}, func(e *testenv.Env) (func(), error) {
		env = e
		clientset = kubernetes.NewForConfigOrDie(e.Config)
		dir, err := os.MkdirTemp("", "machinist-process-test-")
		if err != nil {
			return nil, err
		}
		cleanup := func() { _ = os.RemoveAll(dir) }
		agentBinary = filepath.Join(dir, "machinist")
		return cleanup, testenv.Build("./cmd/machinist", agentBinary)
	}))
}

// Short leases so that a crash shows within seconds.
const (
	leaseSeconds = 3
	renew        = 500 * time.Millisecond
	wait         = 20 * time.Second
)

// newProvider starts a Provider over dir (a new one when empty) and stops
// it when the test ends, showing the agents' logs if the test failed.
func newProvider(t *testing.T, dir string) (*process.Provider, string) {
	t.Helper()
	return newProviderOf(t, dir, nil)
}

// newProviderOf is newProvider with the Hardware that hw makes of the
// agents' own; nil keeps theirs.
func newProviderOf(t *testing.T, dir string, hw func(process.Hardware) process.Hardware) (*process.Provider, string) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	opts := process.Options{
		AgentBinary:          agentBinary,
		StateDir:             dir,
		LeaseDurationSeconds: leaseSeconds,
		RenewInterval:        renew,
	}
	if hw != nil {
		opts.Hardware = hw(process.AgentHardware(opts))
	}
	p, err := process.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "*", "agent.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, b)
			}
		}
	})
	return p, dir
}

// machine is a Machine as the controller would pass it; the provider needs
// no Machine object in the apiserver, and leaving none there keeps other
// tests' controllers away from these machines.
func machine(name string) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "proc", Name: name, UID: uuid.NewUUID()},
		Spec:       machinistv1.MachineSpec{Version: "v1.37.2"},
	}
}

func node(g Gomega, p *process.Provider, providerID string) *corev1.Node {
	name, err := p.NodeName(providerID)
	g.Expect(err).NotTo(HaveOccurred())
	n, err := clientset.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func lease(g Gomega, name string) *coordinationv1.Lease {
	l, err := clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return l
}

// booted waits until the instance's Node is Ready with a boot ID other than
// notBootID, and its Lease renewed by that boot; it returns the Node.
func booted(t *testing.T, p *process.Provider, providerID, notBootID string) *corev1.Node {
	t.Helper()
	var n *corev1.Node
	since := time.Now()
	NewWithT(t).Eventually(func(g Gomega) {
		n = node(g, p, providerID)
		g.Expect(n.Spec.ProviderID).To(Equal(providerID))
		g.Expect(ready(n)).To(BeTrue())
		g.Expect(n.Status.NodeInfo.BootID).NotTo(BeEmpty())
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(notBootID))
		g.Expect(lease(g, n.Name).Spec.RenewTime.Time).To(BeTemporally(">", since))
	}).WithTimeout(wait).Should(Succeed())
	return n
}

// agents lists the live agent processes of providerID, from /proc.
func agents(providerID string) []int {
	var pids []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := bytes.Split(b, []byte{0})
		if len(args) > 2 && string(args[1]) == "agent" && bytes.Contains(b, []byte("--provider-id="+providerID+"\x00")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return pids
}

func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestCreateRegistersAReadyNodeOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, _ := newProvider(t, "")
	m := machine("create")
	class := &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{
		Provider:     process.Name,
		NodeTemplate: &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")}},
	}}

	// Racing calls, as a controller with retries makes them, start one agent.
	ids := make([]string, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	j := join(t)
	for i := range ids {
		wg.Go(func() { ids[i], errs[i] = p.Create(ctx, m, class, j) })
	}
	wg.Wait()
	g.Expect(errs).To(HaveEach(Succeed()))
	id := ids[0]
	g.Expect(ids).To(HaveEach(id))
	g.Expect(id).To(Equal("process:///proc/create/" + string(m.UID)))

	n := booted(t, p, id, "")
	g.Expect(n.Name).To(HavePrefix("create-"))
	g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
	g.Expect(n.Status.Capacity.Cpu().String()).To(Equal("16"))
	g.Expect(p.BootID(id)).To(Equal(n.Status.NodeInfo.BootID))
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(agents(id)).To(Equal([]int{pid}))

	again, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(id))
	g.Expect(p.PID(id)).To(Equal(pid))
	g.Expect(agents(id)).To(Equal([]int{pid}))
	g.Expect(p.Exists(ctx, id)).To(BeTrue())
}

// TestAdoptionHandsNoMachineAnotherMachinesInstance: a Machine of
// another namespace naming a live Machine's instance in spec.providerID is
// refused, permanently and without learning whose it is, and the machine
// is left as it was, its join data and state file too; its own Machine
// naming it gets it back.
func TestAdoptionHandsNoMachineAnotherMachinesInstance(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	orig := machine("orig")
	orig.Namespace = "tenant-a"
	id, err := p.Create(ctx, orig, nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, p, id, "")
	before, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(before.Owner).To(Equal(providers.Owner{Namespace: "tenant-a", Name: "orig", UID: orig.UID}), "Create records the Machine it made the instance for")
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	mdir := filepath.Join(dir, "tenant-a_orig_"+string(orig.UID))
	files := func() map[string]string {
		out := map[string]string{}
		for _, f := range []string{"state.json", "bootstrap-kubeconfig", "kubeconfig", "boot-id"} {
			b, err := os.ReadFile(filepath.Join(mdir, f))
			g.Expect(err).NotTo(HaveOccurred())
			out[f] = string(b)
		}
		return out
	}
	was := files()

	thief := machine("thief")
	thief.Namespace = "tenant-b"
	thief.Spec.ProviderID = id
	_, err = p.Create(ctx, thief, nil, env.JoinData(t))
	g.Expect(err).To(HaveOccurred())
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "no retry hands the instance over: %v", err)
	g.Expect(providers.IsTaken(err)).To(BeTrue(), "%v", err)
	for _, secret := range []string{"tenant-a", "orig", string(orig.UID)} {
		g.Expect(err.Error()).NotTo(ContainSubstring(secret), "the refusal tells whose the instance is")
	}
	g.Expect(p.Describe(ctx, id)).To(Equal(before), "still the original Machine's, on the same boot")
	g.Expect(p.PID(id)).To(Equal(pid))
	g.Expect(agents(id)).To(Equal([]int{pid}))
	g.Expect(p.Restarts(id)).To(Equal(0))
	g.Expect(files()).To(Equal(was), "the refusal wrote to the machine's disk")
	g.Expect(p.FindByUID(ctx, thief.UID)).To(BeEmpty(), "the refused Machine has no instance, whose Delete would destroy the original's")
	instances, err := process.Instances(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instances).To(HaveLen(1))
	g.Expect(instances[0].Owner).To(Equal(providers.OwnerOf(orig)))

	// The original Machine naming its own instance is a repeated call.
	self := orig.DeepCopy()
	self.Spec.ProviderID = id
	g.Expect(p.Create(ctx, self, nil, join(t))).To(Equal(id))
	g.Expect(p.PID(id)).To(Equal(pid))

	// The directory of another Machine's Create under way (no state file
	// yet) is that Machine's too.
	half := machine("half")
	half.Namespace = "tenant-a"
	g.Expect(os.Mkdir(filepath.Join(dir, "tenant-a_half_"+string(half.UID)), 0o755)).To(Succeed())
	early := machine("early")
	early.Spec.ProviderID = providers.ProviderID(process.Name, half)
	_, err = p.Create(ctx, early, nil, join(t))
	g.Expect(providers.IsPermanent(err) && providers.IsTaken(err)).To(BeTrue(), "%v", err)
	g.Expect(p.FindByUID(ctx, early.UID)).To(BeEmpty())

	stranger := machine("stranger")
	stranger.Spec.ProviderID = "process:///proc/ghost/00000000-0000-0000-0000-000000000000"
	_, err = p.Create(ctx, stranger, nil, join(t))
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "adopting an unknown instance cannot succeed later: %v", err)
	g.Expect(providers.IsTaken(err)).To(BeFalse(), "a missing instance is no one's: %v", err)

	for _, bad := range []string{"inmemory:///proc/x/1", "process:///only/two"} {
		_, err := p.Exists(ctx, bad)
		g.Expect(providers.IsPermanent(err)).To(BeTrue(), bad)
		g.Expect(providers.IsPermanent(p.Delete(ctx, bad))).To(BeTrue(), bad)
		g.Expect(providers.IsPermanent(p.Reboot(ctx, bad, providers.Operation{ID: "x"}))).To(BeTrue(), bad)
	}
}

// TestAStateFileWithoutAnOwnerIsItsProviderIDsMachines: a machine made
// before owners were recorded belongs to the Machine its providerID was
// made for, so that no upgrade makes it another Machine's to adopt.
func TestAStateFileWithoutAnOwnerIsItsProviderIDsMachines(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	orig := machine("legacy")
	id, err := first.Create(ctx, orig, nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, first, id, "")
	g.Expect(first.Stop(ctx)).To(Succeed())
	mdir := machineDir(t, dir, "legacy")
	g.Expect(readStateFile(t, mdir)).To(HaveKeyWithValue("owner", map[string]any{"namespace": "proc", "name": "legacy", "uid": string(orig.UID)}))
	crashState(t, mdir, func(st map[string]any) { delete(st, "owner") })

	p, _ := newProvider(t, dir)
	in, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(in.Owner).To(Equal(providers.OwnerOf(orig)))
	g.Expect(p.FindByUID(ctx, orig.UID)).To(Equal(id))
	instances, err := process.Instances(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instances).To(HaveLen(1))
	g.Expect(instances[0].Owner).To(Equal(providers.OwnerOf(orig)))

	thief := machine("thief")
	thief.Spec.ProviderID = id
	_, err = p.Create(ctx, thief, nil, join(t))
	g.Expect(providers.IsPermanent(err) && providers.IsTaken(err)).To(BeTrue(), "%v", err)
	g.Expect(p.FindByUID(ctx, thief.UID)).To(BeEmpty())
	self := orig.DeepCopy()
	self.Spec.ProviderID = id
	g.Expect(p.Create(ctx, self, nil, join(t))).To(Equal(id))
	g.Expect(readStateFile(t, mdir)).NotTo(HaveKey("owner"), "nothing rewrote the legacy state")
}

// TestFindByUIDFindsTheMachineByItsRecordedOwner: a machine whose state
// file records another owner than the Machine it was made for (as one
// handed over would) is that owner's: FindByUID finds it by the owner's
// UID, past its directory's name, and the Machine it was made for no
// longer gets it.
func TestFindByUIDFindsTheMachineByItsRecordedOwner(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	maker := machine("maker")
	id, err := first.Create(ctx, maker, nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, first, id, "")
	g.Expect(first.Stop(ctx)).To(Succeed())
	holder := machine("holder")
	holder.Namespace = "imported"
	crashState(t, machineDir(t, dir, "maker"), func(st map[string]any) {
		st["owner"] = map[string]any{"namespace": "imported", "name": "holder", "uid": string(holder.UID)}
	})

	p, _ := newProvider(t, dir)
	g.Expect(p.FindByUID(ctx, holder.UID)).To(Equal(id))
	g.Expect(p.FindByUID(ctx, maker.UID)).To(BeEmpty(), "its directory names the maker, which it no longer belongs to")
	g.Expect(p.Describe(ctx, id)).To(HaveField("Owner", providers.OwnerOf(holder)))
	instances, err := process.Instances(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instances).To(ConsistOf(HaveField("Owner", providers.OwnerOf(holder))))

	adopter := holder.DeepCopy()
	adopter.Spec.ProviderID = id
	g.Expect(p.Create(ctx, adopter, nil, join(t))).To(Equal(id))
	_, err = p.Create(ctx, maker, nil, join(t))
	g.Expect(providers.IsPermanent(err) && providers.IsTaken(err)).To(BeTrue(), "the maker's Create: %v", err)
	g.Expect(p.Delete(ctx, id)).To(Succeed())
	g.Expect(p.FindByUID(ctx, holder.UID)).To(BeEmpty())
}

func TestRebootIsIdempotentOnOperationID(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, _ := newProvider(t, "")
	id, err := p.Create(ctx, machine("reboot"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, p, id, "")
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	// A reboot keeps what others put on the Node.
	g.Expect(clientset.CoreV1().Nodes().Patch(ctx, before.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{})).Error().NotTo(HaveOccurred())

	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1"})).To(Succeed())
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(after.UID).To(Equal(before.UID))
	g.Expect(after.Labels).To(HaveKeyWithValue("team", "a"))
	newPID, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(newPID).NotTo(Equal(pid))
	g.Expect(gone(pid)).To(BeTrue())
	g.Expect(p.Restarts(id)).To(Equal(1))

	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1"})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(p.PID(id)).To(Equal(newPID))
	g.Expect(p.BootID(id)).To(Equal(after.Status.NodeInfo.BootID))
}

func TestUpdateRunsTheNewVersionOnTheSameNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	id, err := p.Create(ctx, machine("update"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, p, id, "")
	g.Expect(before.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
	g.Expect(clientset.CoreV1().Nodes().Patch(ctx, before.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{})).Error().NotTo(HaveOccurred())
	g.Expect(p.InPlace(providers.Change{Version: true})).To(BeTrue())
	g.Expect(p.InPlace(providers.Change{Version: true, Class: true})).To(BeFalse())
	g.Expect(providers.IsPermanent(p.Update(ctx, id, providers.Operation{ID: "no-version"}))).To(BeTrue())

	g.Expect(p.Update(ctx, id, providers.Operation{ID: "op-1", Version: "v1.38.0"})).To(Succeed())
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(after.Name).To(Equal(before.Name))
	g.Expect(after.UID).To(Equal(before.UID), "the same Node, not registered afresh")
	g.Expect(after.Labels).To(HaveKeyWithValue("team", "a"))
	g.Expect(after.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
	g.Expect(p.Restarts(id)).To(Equal(1))
	st := readStateFile(t, machineDir(t, dir, "update"))
	g.Expect(st).To(HaveKeyWithValue("version", "v1.38.0"))

	// Exactly once per operation ID.
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Update(ctx, id, providers.Operation{ID: "op-1", Version: "v1.38.0"})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(p.PID(id)).To(Equal(pid))

	// A new provider over the same state boots the version it recorded.
	g.Expect(p.Stop(ctx)).To(Succeed())
	next, _ := newProvider(t, dir)
	g.Expect(next.Exists(ctx, id)).To(BeTrue())
	g.Expect(booted(t, next, id, after.Status.NodeInfo.BootID).Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
}

// lacking is Hardware that lacks the files of some versions, as a qemu
// provider whose kubelet of a version was removed from its directory.
type lacking struct {
	process.Hardware
	mu      sync.Mutex
	without map[string]bool
}

func (h *lacking) Check(spec json.RawMessage, capacity corev1.ResourceList, version string) error {
	h.mu.Lock()
	gone := h.without[version]
	h.mu.Unlock()
	if gone {
		return fmt.Errorf("no files of version %s here", version)
	}
	return h.Hardware.Check(spec, capacity, version)
}

func (h *lacking) set(version string, gone bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.without[version] = gone
}

// A machine whose own version's files went after it booted is refused a
// reboot and a repair before they halt it, and so is an update to a
// version without files: each fails permanently, names what it was and
// why, and leaves the machine running as it was, with nothing pending.
// Once the files are back, the same operation reboots it.
func TestARestartThatCouldNotBootAgainLeavesTheMachineRunning(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	hw := &lacking{without: map[string]bool{}}
	p, dir := newProviderOf(t, "", func(agents process.Hardware) process.Hardware {
		hw.Hardware = agents
		return hw
	})
	id, err := p.Create(ctx, machine("files"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, p, id, "")
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())

	hw.set("v1.37.2", true)
	hw.set("v1.38.0", true)
	for _, c := range []struct {
		verb string
		do   func() error
	}{
		{"rebooting", func() error { return p.Reboot(ctx, id, providers.Operation{ID: "reboot-1"}) }},
		{"rebooting", func() error { return p.Reboot(ctx, id, providers.Operation{ID: "reboot-2", Hard: true}) }},
		{"repairing", func() error { return p.Repair(ctx, id, providers.Operation{ID: "repair-1", Join: join(t)}) }},
		{"updating", func() error { return p.Update(ctx, id, providers.Operation{ID: "update-1", Version: "v1.38.0"}) }},
	} {
		err := c.do()
		g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%s: %v", c.verb, err)
		g.Expect(err).To(MatchError(And(ContainSubstring(c.verb+" "+id), ContainSubstring("no files of version"))))
		g.Expect(p.PID(id)).To(Equal(pid), "%s: the machine halted", c.verb)
		g.Expect(gone(pid)).To(BeFalse(), "%s: the machine halted", c.verb)
		g.Expect(p.Restarts(id)).To(Equal(0))
		g.Expect(p.BootID(id)).To(Equal(before.Status.NodeInfo.BootID))
		st := readStateFile(t, machineDir(t, dir, "files"))
		g.Expect(st).NotTo(HaveKey("pending"), "%s: left pending", c.verb)
		g.Expect(st).NotTo(HaveKey("lastOperation"), "%s: recorded done", c.verb)
		g.Expect(st).To(HaveKeyWithValue("version", "v1.37.2"))
	}
	g.Expect(ready(node(g, p, id))).To(BeTrue())

	// The files back, the operation refused is carried out.
	hw.set("v1.37.2", false)
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "reboot-1"})).To(Succeed())
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(after.UID).To(Equal(before.UID))
	g.Expect(gone(pid)).To(BeTrue())
	g.Expect(p.Restarts(id)).To(Equal(1))
}

func TestRepairWipesAndReRegisters(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	id, err := p.Create(ctx, machine("repair"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, p, id, "")
	g.Expect(clientset.CoreV1().Nodes().Patch(ctx, before.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{})).Error().NotTo(HaveOccurred())
	dirs, err := filepath.Glob(filepath.Join(dir, "proc_repair_*"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dirs).To(HaveLen(1))
	junk := filepath.Join(dirs[0], "scratch")
	g.Expect(os.WriteFile(junk, []byte("left by the old image"), 0o644)).To(Succeed())

	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "r-1", Join: join(t)})).To(Succeed())
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(after.UID).NotTo(Equal(before.UID), "the Node registered afresh")
	g.Expect(after.Labels).NotTo(HaveKey("team"))
	g.Expect(junk).NotTo(BeAnExistingFile())
	g.Expect(p.Restarts(id)).To(Equal(1))

	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "r-1", Join: join(t)})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(node(g, p, id).UID).To(Equal(after.UID))
}

// TestKillNineMakesTheMachineUnhealthy runs the Machine controller with this
// provider: a Machine turns Running, and once its agent is killed outright
// its Lease goes stale and the Machine's NodeHealthy turns False.
func TestKillNineMakesTheMachineUnhealthy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	if testing.Verbose() {
		ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	} else {
		ctrllog.SetLogger(logr.Discard())
	}
	p, _ := newProvider(t, "")
	registry := providers.NewRegistry()
	g.Expect(registry.Register(process.Name, p)).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	mgr, err := manager.New(mctx, env.Config, env.Scheme, manager.Options{
		Actuators:      registry,
		MachineWorkers: 2,
		Backoff:        machinecontroller.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
		DrainPoll:      200 * time.Millisecond,
		Repeatable:     true,
		Registry:       prometheus.NewRegistry(),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	// Registered after newProvider's, so it runs first: the controller
	// stops before the provider does.
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})

	ns := env.NewNamespace(t, "process")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proc"},
		Spec:       machinistv1.MachineClassSpec{Provider: process.Name},
	}
	g.Expect(env.Client.Create(ctx, class)).To(Succeed())
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "victim"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class.Name}, Version: "v1.37.2"},
	}
	g.Expect(env.Client.Create(ctx, m)).To(Succeed())
	get := func(g Gomega) *machinistv1.Machine {
		out := &machinistv1.Machine{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), out)).To(Succeed())
		return out
	}
	healthy := func(g Gomega) *metav1.Condition {
		return meta.FindStatusCondition(get(g).Status.Conditions, machinistv1.ConditionNodeHealthy)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(get(g).Status.Phase).To(Equal(machinistv1.MachineRunning))
		g.Expect(healthy(g)).To(HaveField("Status", metav1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	running := get(g)
	id, nodeName := running.Status.ProviderID, running.Status.NodeRef.Name

	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() error { _, err := p.PID(id); return err }).WithTimeout(wait).Should(HaveOccurred())

	// Nothing renews the Lease any more...
	renewed := lease(g, nodeName).Spec.RenewTime.Time
	g.Consistently(func(g Gomega) time.Time {
		return lease(g, nodeName).Spec.RenewTime.Time
	}).WithTimeout(3 * renew).Should(BeTemporally("==", renewed))
	// ...so the controller reads the stale Lease as an unhealthy Node, and
	// Kubernetes' node lifecycle controller marks the Node NotReady
	// (Ready=Unknown); Machinist writes no Node status.
	g.Eventually(healthy).WithTimeout(3*leaseSeconds*time.Second + 5*time.Second).Should(And(
		HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "NodeLeaseExpired")))
	g.Eventually(func(g Gomega) corev1.ConditionStatus {
		for _, c := range node(g, p, id).Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status
			}
		}
		return ""
	}).WithTimeout(wait).Should(Equal(corev1.ConditionUnknown))
	out, err := exec.Command(filepath.Join(testenv.BinDir(), "kubectl"), "--kubeconfig", env.Kubeconfig, "get", "node", nodeName).CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	g.Expect(string(out)).To(MatchRegexp(nodeName + `\s+NotReady`))
	g.Expect(p.Exists(ctx, id)).To(BeTrue(), "a crashed machine still exists")

	// Deleting the Machine deletes the crashed instance and its Node.
	g.Expect(env.Client.Delete(ctx, m)).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{})
	}).WithTimeout(wait).Should(Satisfy(apierrors.IsNotFound))
	g.Expect(p.Exists(ctx, id)).To(BeFalse())
	_, err = clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the Node: %v", err)
}

func TestNewProviderRestartsStoppedMachines(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	id, err := first.Create(ctx, machine("survivor"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, first, id, "")
	pid, err := first.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(first.Stop(ctx)).To(Succeed())
	g.Expect(gone(pid)).To(BeTrue())

	second, _ := newProvider(t, dir)
	g.Expect(second.Exists(ctx, id)).To(BeTrue())
	after := booted(t, second, id, before.Status.NodeInfo.BootID)
	g.Expect(after.UID).To(Equal(before.UID))
	newPID, err := second.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(agents(id)).To(Equal([]int{newPID}))
	g.Expect(second.Restarts(id)).To(Equal(0), "a provider restart is not a reboot")
}

func TestNewProviderAdoptsRunningAgents(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	first, dir := newProvider(t, "")
	id, err := first.Create(ctx, machine("adoptee"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	n := booted(t, first, id, "")
	pid, err := first.PID(id)
	g.Expect(err).NotTo(HaveOccurred())

	// As after a provider that died without Stop: its agents still run.
	second, _ := newProvider(t, dir)
	g.Expect(second.PID(id)).To(Equal(pid))
	g.Expect(agents(id)).To(Equal([]int{pid}))
	g.Expect(second.BootID(id)).To(Equal(n.Status.NodeInfo.BootID))

	g.Expect(second.Stop(ctx)).To(Succeed())
	g.Eventually(func() bool { return gone(pid) }).WithTimeout(wait).Should(BeTrue())
}

func TestDeleteStopsTheAgentAndRemovesItsState(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	m := machine("doomed")
	id, err := p.Create(ctx, m, nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, p, id, "")
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(p.FindByUID(ctx, m.UID)).To(Equal(id), "found by the Machine's UID")
	g.Expect(p.FindByUID(ctx, "some-other-uid")).To(BeEmpty())

	g.Expect(p.Delete(ctx, id)).To(Succeed())
	g.Expect(p.FindByUID(ctx, m.UID)).To(BeEmpty(), "a deleted instance is not found")
	g.Expect(gone(pid)).To(BeTrue())
	g.Expect(p.Exists(ctx, id)).To(BeFalse())
	g.Expect(os.ReadDir(dir)).To(BeEmpty())
	_, err = p.PID(id)
	g.Expect(err).To(HaveOccurred())
	g.Expect(p.Delete(ctx, id)).To(Succeed(), "deleting what is gone is not an error")
	g.Expect(providers.IsPermanent(p.Reboot(ctx, id, providers.Operation{ID: "late"}))).To(BeTrue())
}

func TestStopLeavesNoAgentRunning(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, _ := newProvider(t, "")
	var ids []string
	var pids []int
	for _, name := range []string{"a", "b", "c"} {
		id, err := p.Create(ctx, machine("stop-"+name), nil, join(t))
		g.Expect(err).NotTo(HaveOccurred())
		pid, err := p.PID(id)
		g.Expect(err).NotTo(HaveOccurred())
		ids, pids = append(ids, id), append(pids, pid)
	}
	// One machine crashed already: Stop must cope with it.
	g.Expect(syscall.Kill(pids[2], syscall.SIGKILL)).To(Succeed())

	g.Expect(p.Stop(ctx)).To(Succeed())
	for i, id := range ids {
		g.Expect(gone(pids[i])).To(BeTrue(), id)
		g.Expect(agents(id)).To(BeEmpty(), id)
	}
	_, err := p.Create(ctx, machine("late"), nil, join(t))
	g.Expect(err).To(MatchError(ContainSubstring("stopped")))
}

// machineDir is the directory of the machine named name in the state
// directory dir.
func machineDir(t *testing.T, dir, name string) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(dir, "proc_"+name+"_*"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("the directory of machine %s in %s: %v %v", name, dir, dirs, err)
	}
	return dirs[0]
}

// readStateFile reads a machine's state.json.
func readStateFile(t *testing.T, mdir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mdir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	st := map[string]any{}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// crashState edits a machine's state.json into what a provider killed
// (SIGKILL) at some instruction would have left.
func crashState(t *testing.T, mdir string, edit func(st map[string]any)) {
	t.Helper()
	st := readStateFile(t, mdir)
	edit(st)
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "state.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// statePID is the agent PID a state file records.
func statePID(st map[string]any) int {
	pid, _ := st["pid"].(float64)
	return int(pid)
}

// cmdline is a process's command line.
func cmdline(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// startAgent starts an agent with argv in mdir, as a provider killed after
// cmd.Start and before it recorded the PID would have left it; it is killed
// when the test ends if it still runs.
func startAgent(t *testing.T, mdir string, argv []string) int {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(mdir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = mdir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // reaped, so that a killed one is gone
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd.Process.Pid
}

// stoppedMachine creates the machine name with a first Provider over dir,
// waits for its boot, and stops that Provider, as a provider killed after
// halting the agent (state PID 0, no agent running) would have left it. It
// returns the providerID, the Node as booted, and the agent's command line.
func stoppedMachine(t *testing.T, dir, name string) (string, *corev1.Node, []string) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	first, _ := newProvider(t, dir)
	id, err := first.Create(ctx, machine(name), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	n := booted(t, first, id, "")
	pid, err := first.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	argv := cmdline(t, pid)
	g.Expect(first.Stop(ctx)).To(Succeed())
	g.Expect(agents(id)).To(BeEmpty())
	g.Expect(statePID(readStateFile(t, machineDir(t, dir, name)))).To(BeZero())
	return id, n, argv
}

// TestNewTakesNothingOverUntilTheFirstCall catches a standby replica that
// boots, when it is made, the agent of a machine the leader had halted (in
// a reboot), so that two agents run once the leader boots it.
func TestNewTakesNothingOverUntilTheFirstCall(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	id, before, _ := stoppedMachine(t, dir, "lazy")
	mdir := machineDir(t, dir, "lazy")
	stateBefore := readStateFile(t, mdir)

	leader, _ := newProvider(t, dir)
	standby, _ := newProvider(t, dir)
	g.Consistently(func() []int { return agents(id) }).WithTimeout(2 * time.Second).Should(BeEmpty())
	g.Expect(readStateFile(t, mdir)).To(Equal(stateBefore))

	// A broken machine fails the takeover, which racing first calls make
	// once each, without booting the good machine twice.
	broken := filepath.Join(dir, "proc_broken_00000000-0000-0000-0000-000000000000")
	g.Expect(os.Mkdir(broken, 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(broken, "state.json"), []byte("{"), 0o644)).To(Succeed())
	errs := make([]error, 4)
	var wg sync.WaitGroup
	wg.Go(func() { _, errs[0] = leader.Restarts(id) })
	wg.Go(func() { _, errs[1] = leader.Exists(ctx, id) })
	wg.Go(func() { _, errs[2] = leader.PID(id) })
	wg.Go(func() { errs[3] = leader.Reboot(ctx, id, providers.Operation{ID: "never"}) })
	wg.Wait()
	g.Expect(errs).To(HaveEach(MatchError(ContainSubstring("broken"))))
	g.Expect(agents(id)).To(HaveLen(1))
	pid := agents(id)[0]

	// Tried again on the next call, once the cause is gone.
	g.Expect(os.RemoveAll(broken)).To(Succeed())
	g.Expect(leader.PID(id)).To(Equal(pid))
	booted(t, leader, id, before.Status.NodeInfo.BootID)
	g.Expect(leader.Restarts(id)).To(Equal(0))
	g.Expect(agents(id)).To(Equal([]int{pid}))

	// The standby was never called: its Stop leaves the leader's agent be.
	g.Expect(standby.Stop(ctx)).To(Succeed())
	g.Expect(agents(id)).To(Equal([]int{pid}))
	_, err := standby.PID(id)
	g.Expect(err).To(MatchError(ContainSubstring("stopped")), "a stopped provider takes nothing over")
	g.Expect(agents(id)).To(Equal([]int{pid}))
}

// TestTakeoverAdoptsAnAgentWhosePIDWasNotRecorded catches a takeover that
// trusts the recorded PID alone: a provider killed between cmd.Start and
// its state write leaves an agent running while state.json says PID 0, and
// the takeover must adopt it, not start a second one.
func TestTakeoverAdoptsAnAgentWhosePIDWasNotRecorded(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	id, before, argv := stoppedMachine(t, dir, "unrecorded")
	mdir := machineDir(t, dir, "unrecorded")
	orphan := startAgent(t, mdir, argv)

	p, _ := newProvider(t, dir)
	g.Expect(p.Exists(ctx, id)).To(BeTrue())
	g.Expect(agents(id)).To(Equal([]int{orphan}))
	g.Expect(p.PID(id)).To(Equal(orphan))
	g.Expect(statePID(readStateFile(t, mdir))).To(Equal(orphan), "the adopted PID is recorded")
	n := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(p.BootID(id)).To(Equal(n.Status.NodeInfo.BootID))
	g.Consistently(func() []int { return agents(id) }).WithTimeout(time.Second).Should(Equal([]int{orphan}))
	g.Expect(p.Restarts(id)).To(Equal(0))

	// Adopted for good: Stop ends it.
	g.Expect(p.Stop(ctx)).To(Succeed())
	g.Eventually(func() []int { return agents(id) }).WithTimeout(wait).Should(BeEmpty())
}

// TestTakeoverKillsDuplicateAgents catches a takeover that leaves two agents
// of one machine running: it keeps the recorded one if it runs, else any
// one, records it, and kills the others.
func TestTakeoverKillsDuplicateAgents(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()

	// The provider whose state these are, left as killed: not called again.
	first, _ := newProvider(t, dir)
	recordedID, err := first.Create(ctx, machine("recorded"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	unrecordedID, err := first.Create(ctx, machine("twins"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	recorded, err := first.PID(recordedID)
	g.Expect(err).NotTo(HaveOccurred())
	unrecorded, err := first.PID(unrecordedID)
	g.Expect(err).NotTo(HaveOccurred())
	argv := cmdline(t, unrecorded)

	// One recorded agent, running, and a duplicate of it.
	dup := startAgent(t, machineDir(t, dir, "recorded"), cmdline(t, recorded))
	g.Expect(agents(recordedID)).To(ConsistOf(recorded, dup))

	// Two agents, neither recorded: the recorded one crashed.
	g.Expect(syscall.Kill(unrecorded, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() bool { return gone(unrecorded) }).WithTimeout(wait).Should(BeTrue())
	crashState(t, machineDir(t, dir, "twins"), func(st map[string]any) { st["pid"] = 0 })
	twins := []int{startAgent(t, machineDir(t, dir, "twins"), argv), startAgent(t, machineDir(t, dir, "twins"), argv)}
	g.Expect(agents(unrecordedID)).To(ConsistOf(twins))

	p, _ := newProvider(t, dir)
	g.Expect(p.PID(recordedID)).To(Equal(recorded))
	g.Expect(agents(recordedID)).To(Equal([]int{recorded}))
	g.Expect(statePID(readStateFile(t, machineDir(t, dir, "recorded")))).To(Equal(recorded))

	kept, err := p.PID(unrecordedID)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(twins).To(ContainElement(kept))
	g.Expect(agents(unrecordedID)).To(Equal([]int{kept}))
	g.Expect(statePID(readStateFile(t, machineDir(t, dir, "twins")))).To(Equal(kept))
	booted(t, p, unrecordedID, "")
	booted(t, p, recordedID, "")
	g.Expect(agents(recordedID)).To(Equal([]int{recorded}))
	g.Expect(agents(unrecordedID)).To(Equal([]int{kept}))
}

// TestTakeoverFinishesAPendingOpWhoseHaltHadCompleted catches a reboot or
// repair done twice, or its boot done without the operation recorded, when
// the provider was killed after halting the agent and before booting it
// again: the takeover boots the machine (redoing a repair's wipe) and
// records the operation done, and the controller's retry of the same
// operation ID does nothing.
func TestTakeoverFinishesAPendingOpWhoseHaltHadCompleted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		repair  bool
		version string
		// deadPID: killed after the agent exited and before halt wrote
		// PID 0, so the state names an agent that is gone.
		deadPID bool
	}{
		{name: "reboot-dead-pid", deadPID: true},
		{name: "repair-pid-0", repair: true},
		{name: "update-pid-0", version: "v1.38.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			dir := t.TempDir()
			first, _ := newProvider(t, dir)
			id, err := first.Create(ctx, machine(tc.name), nil, join(t))
			g.Expect(err).NotTo(HaveOccurred())
			before := booted(t, first, id, "")
			oldPID, err := first.PID(id)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(clientset.CoreV1().Nodes().Patch(ctx, before.Name, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{})).Error().NotTo(HaveOccurred())
			g.Expect(first.Stop(ctx)).To(Succeed())
			g.Expect(gone(oldPID)).To(BeTrue())
			mdir := machineDir(t, dir, tc.name)
			junk := filepath.Join(mdir, "scratch")
			g.Expect(os.WriteFile(junk, []byte("left by the old image"), 0o644)).To(Succeed())
			crashState(t, mdir, func(st map[string]any) {
				st["pending"] = map[string]any{"id": "op-1", "repair": tc.repair, "version": tc.version}
				if tc.deadPID {
					st["pid"] = oldPID
				}
			})

			p, _ := newProvider(t, dir)
			do := p.Reboot
			switch {
			case tc.repair:
				do = p.Repair
			case tc.version != "":
				do = p.Update
			}
			// The first call takes over, which finishes the operation.
			g.Expect(p.Restarts(id)).To(Equal(1))
			pid, err := p.PID(id)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(agents(id)).To(Equal([]int{pid}))
			st := readStateFile(t, mdir)
			g.Expect(st).NotTo(HaveKey("pending"))
			g.Expect(st).To(HaveKeyWithValue("lastOperation", "op-1"))
			g.Expect(statePID(st)).To(Equal(pid))
			after := booted(t, p, id, before.Status.NodeInfo.BootID)
			if tc.repair {
				g.Expect(after.UID).NotTo(Equal(before.UID), "the Node registered afresh")
				g.Expect(after.Labels).NotTo(HaveKey("team"))
				g.Expect(junk).NotTo(BeAnExistingFile())
			} else {
				g.Expect(after.UID).To(Equal(before.UID))
				g.Expect(after.Labels).To(HaveKeyWithValue("team", "a"))
				g.Expect(junk).To(BeAnExistingFile())
			}
			if tc.version != "" {
				g.Expect(after.Status.NodeInfo.KubeletVersion).To(Equal(tc.version), "the update finished with its version")
				g.Expect(st).To(HaveKeyWithValue("version", tc.version))
			}

			// The controller's retry finds it done: one restart, one new
			// boot. Its retry of a repair carries join data as every
			// repair does, and a repair without is refused.
			retry := providers.Operation{ID: "op-1", Version: tc.version}
			if tc.repair {
				retry.Join = join(t)
			}
			for range 2 {
				g.Expect(do(ctx, id, retry)).To(Succeed())
				g.Expect(p.Restarts(id)).To(Equal(1))
				g.Expect(p.PID(id)).To(Equal(pid))
				g.Expect(p.BootID(id)).To(Equal(after.Status.NodeInfo.BootID))
				g.Expect(agents(id)).To(Equal([]int{pid}))
			}
			g.Expect(node(g, p, id).UID).To(Equal(after.UID))
		})
	}
}

// TestTakeoverRecordsDoneAPendingOpWhoseAgentWasStartedAfterTheHalt catches
// a reboot done twice when the provider was killed after starting the new
// agent and before recording it with the operation done: the takeover
// adopts that agent and records the operation done, and the retry does
// nothing.
func TestTakeoverRecordsDoneAPendingOpWhoseAgentWasStartedAfterTheHalt(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	id, before, argv := stoppedMachine(t, dir, "rebooted")
	mdir := machineDir(t, dir, "rebooted")
	crashState(t, mdir, func(st map[string]any) {
		st["pending"] = map[string]any{"id": "op-1", "hard": true}
	})
	rebooted := startAgent(t, mdir, argv)

	p, _ := newProvider(t, dir)
	// The controller's retry, the first call: the takeover records the
	// operation done, and the retry finds it so.
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1", Hard: true})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(p.PID(id)).To(Equal(rebooted))
	g.Expect(agents(id)).To(Equal([]int{rebooted}))
	st := readStateFile(t, mdir)
	g.Expect(st).NotTo(HaveKey("pending"))
	g.Expect(st).To(HaveKeyWithValue("lastOperation", "op-1"))
	g.Expect(statePID(st)).To(Equal(rebooted))
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(p.BootID(id)).To(Equal(after.Status.NodeInfo.BootID))

	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1", Hard: true})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(p.PID(id)).To(Equal(rebooted))
	g.Expect(p.BootID(id)).To(Equal(after.Status.NodeInfo.BootID))
}

// TestTakeoverLeavesPendingAnOpWhoseAgentStillRuns catches an operation
// recorded done, or carried out by the takeover, when the provider was
// killed after recording it pending and before halting the agent: the
// takeover adopts the agent with the operation still pending, and the
// retry carries it out once.
func TestTakeoverLeavesPendingAnOpWhoseAgentStillRuns(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	id, err := first.Create(ctx, machine("unhalted"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, first, id, "")
	pid, err := first.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	mdir := machineDir(t, dir, "unhalted")
	// The first provider is left as killed: not called again.
	crashState(t, mdir, func(st map[string]any) {
		st["pending"] = map[string]any{"id": "op-1"}
	})

	p, _ := newProvider(t, dir)
	g.Expect(p.Restarts(id)).To(Equal(0))
	g.Expect(p.PID(id)).To(Equal(pid))
	g.Expect(agents(id)).To(Equal([]int{pid}))
	g.Expect(p.BootID(id)).To(Equal(before.Status.NodeInfo.BootID))
	st := readStateFile(t, mdir)
	g.Expect(st).To(HaveKeyWithValue("pending", HaveKeyWithValue("id", "op-1")))
	g.Expect(st).NotTo(HaveKey("lastOperation"))

	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1"})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	newPID, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(newPID).NotTo(Equal(pid))
	g.Eventually(func() bool { return gone(pid) }).WithTimeout(wait).Should(BeTrue())
	g.Expect(agents(id)).To(Equal([]int{newPID}))
	after := booted(t, p, id, before.Status.NodeInfo.BootID)
	st = readStateFile(t, mdir)
	g.Expect(st).NotTo(HaveKey("pending"))
	g.Expect(st).To(HaveKeyWithValue("lastOperation", "op-1"))

	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "op-1"})).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1))
	g.Expect(p.PID(id)).To(Equal(newPID))
	g.Expect(p.BootID(id)).To(Equal(after.Status.NodeInfo.BootID))
}

// TestTakeoverLeavesACrashedMachineOff: an agent killed outright is a
// machine that crashed. A new provider (a restarted or new leader) must not
// power it on, or it would heal what only a reboot, a repair or a health
// check should; a reboot then brings it back, once.
func TestTakeoverLeavesACrashedMachineOff(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	id, err := first.Create(ctx, machine("crashed"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, first, id, "")
	pid, err := first.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() bool { return gone(pid) }).WithTimeout(wait).Should(BeTrue())

	// As after the first provider's process was killed too.
	second, _ := newProvider(t, dir)
	g.Expect(second.Exists(ctx, id)).To(BeTrue())
	g.Consistently(func() []int { return agents(id) }).WithTimeout(2 * time.Second).Should(BeEmpty())
	_, err = second.PID(id)
	g.Expect(err).To(HaveOccurred(), "no agent runs")

	g.Expect(second.Reboot(ctx, id, providers.Operation{ID: "op-1"})).To(Succeed())
	booted(t, second, id, before.Status.NodeInfo.BootID)
	g.Expect(agents(id)).To(HaveLen(1))
	g.Expect(second.Restarts(id)).To(Equal(1))
}

// TestTakeoverDoesNotBootAMachineBeingDeleted: a provider killed in the
// middle of Delete, after the agent stopped and before the directory went,
// leaves a machine the next provider must not boot; the retried Delete
// finishes.
func TestTakeoverDoesNotBootAMachineBeingDeleted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dir := t.TempDir()
	first, _ := newProvider(t, dir)
	id, err := first.Create(ctx, machine("half-deleted"), nil, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	booted(t, first, id, "")
	g.Expect(first.Stop(ctx)).To(Succeed())
	mdir := machineDir(t, dir, "half-deleted")
	crashState(t, mdir, func(st map[string]any) { st["deleting"] = true })

	second, _ := newProvider(t, dir)
	g.Expect(second.Exists(ctx, id)).To(BeTrue())
	g.Consistently(func() []int { return agents(id) }).WithTimeout(2 * time.Second).Should(BeEmpty())
	g.Expect(second.Delete(ctx, id)).To(Succeed())
	g.Expect(second.Exists(ctx, id)).To(BeFalse())
	g.Expect(agents(id)).To(BeEmpty())
}

// joins keeps each test's join data, so that a test makes one token.
var joins sync.Map // *testing.T → providers.Join

// join is the test's join data: a bootstrap token of its own, deleted
// when the test ends.
func join(t *testing.T) providers.Join {
	t.Helper()
	if j, ok := joins.Load(t); ok {
		return j.(providers.Join)
	}
	j := env.JoinData(t)
	joins.Store(t, j)
	t.Cleanup(func() { joins.Delete(t) })
	return j
}

// private reads a file that must be readable by its owner alone.
func private(g Gomega, path string) []byte {
	fi, err := os.Stat(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fi.Mode().Perm()).To(Equal(os.FileMode(0o600)), path)
	b, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	return b
}

func TestMachinesJoinWithTheirJoinDataAndKeepTheirCredentials(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	first := env.JoinData(t)
	id, err := p.Create(ctx, machine("joins"), nil, first)
	g.Expect(err).NotTo(HaveOccurred())
	before := booted(t, p, id, "")
	dirs, err := filepath.Glob(filepath.Join(dir, "proc_joins_*"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dirs).To(HaveLen(1))
	bootstrapFile, kubeconfig := filepath.Join(dirs[0], "bootstrap-kubeconfig"), filepath.Join(dirs[0], "kubeconfig")

	j, err := nodeagent.JoinFromBootstrapKubeconfig(private(g, bootstrapFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(j.Token).To(Equal(first.Token))
	creds, err := nodeagent.CredentialsFromKubeconfig(private(g, kubeconfig))
	g.Expect(err).NotTo(HaveOccurred())
	block, _ := pem.Decode(creds.CertPEM)
	g.Expect(block).NotTo(BeNil())
	cert, err := x509.ParseCertificate(block.Bytes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cert.Subject.CommonName).To(Equal("system:node:" + before.Name))

	// The agent runs with what it got, not with the provider's kubeconfig.
	pid, err := p.PID(id)
	g.Expect(err).NotTo(HaveOccurred())
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(cmdline)).NotTo(ContainSubstring(env.Kubeconfig))
	g.Expect(string(cmdline)).NotTo(ContainSubstring(first.Token))
	g.Expect(string(cmdline)).To(ContainSubstring("--kubeconfig=" + kubeconfig + "\x00"))

	// A reboot keeps the machine's credentials, as a kubelet keeps them.
	kept := private(g, kubeconfig)
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "b-1"})).To(Succeed())
	rebooted := booted(t, p, id, before.Status.NodeInfo.BootID)
	g.Expect(private(g, kubeconfig)).To(Equal(kept), "a reboot joined again")

	// A repair wipes them: the machine joins with the repair's data.
	second := env.JoinData(t)
	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "r-1", Join: second})).To(Succeed())
	booted(t, p, id, rebooted.Status.NodeInfo.BootID)
	j, err = nodeagent.JoinFromBootstrapKubeconfig(private(g, bootstrapFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(j.Token).To(Equal(second.Token))
	g.Expect(private(g, kubeconfig)).NotTo(Equal(kept), "the repaired machine kept its old credentials")
	g.Expect(filepath.Join(dirs[0], "bootstrap-kubeconfig.next")).NotTo(BeAnExistingFile())

	// The provider's log, and the agent's, name no token.
	logged, err := os.ReadFile(filepath.Join(dirs[0], "agent.log"))
	g.Expect(err).NotTo(HaveOccurred())
	for _, k := range []providers.Join{first, second} {
		_, secret, _ := strings.Cut(k.Token, ".")
		g.Expect(string(logged)).NotTo(ContainSubstring(secret))
	}
}

func TestCreateAndRepairRefuseMissingJoinData(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, dir := newProvider(t, "")
	_, err := p.Create(ctx, machine("nojoin"), nil, providers.Join{Server: env.Config.Host})
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(providers.ErrNoJoin))
	g.Expect(filepath.Glob(filepath.Join(dir, "proc_nojoin_*"))).To(BeEmpty())
	err = p.Repair(ctx, "process:///proc/nojoin/"+string(uuid.NewUUID()), providers.Operation{ID: "r"})
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(providers.ErrNoJoin))
}

// TestDescribeTellsWhyAJoinFails: the agent's join lines, in its log,
// reach Describe; once it joins, no failure is reported.
func TestDescribeTellsWhyAJoinFails(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p, _ := newProvider(t, "")
	m := machine("refused")
	unknown, err := bootstrap.NewToken()
	g.Expect(err).NotTo(HaveOccurred())
	j := join(t)
	j.Token = unknown.Value()
	id, err := p.Create(ctx, m, nil, j)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() *providers.JoinFailure {
		in, err := p.Describe(ctx, id)
		g.Expect(err).NotTo(HaveOccurred())
		return in.JoinFailure
	}, nodeagent.JoinGrace+20*time.Second, 200*time.Millisecond).Should(And(
		HaveField("Reason", machinistv1.ReasonBootstrapTokenRefused),
		HaveField("Message", ContainSubstring("--enable-bootstrap-token-auth"))))

	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "op-1", Join: join(t)})).To(Succeed())
	booted(t, p, id, "")
	in, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(in.JoinFailure).To(BeNil())
}
