package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// BenchmarkQEMU times real VMs under the controllers, with the qemu
// provider in the manager's process and this host's accelerator (TCG
// where KVM does not work): "boot" is one Machine from its creation to a
// Ready Node, with the QEMU process's resident memory then and once it
// has settled; "scale-up" a MachineSet from 0 to 10; "rolling-upgrade" a
// MachineDeployment of 5 VMs to a new version, one surge at a time.
func BenchmarkQEMU(b *testing.B) {
	b.Run("boot", func(b *testing.B) {
		for range b.N {
			q := startQEMU(b)
			took := q.scaleUp(b, 1)
			b.ReportMetric(took.Seconds(), "s-to-ready")
			b.ReportMetric(q.rssPerVM(b), "MiB-rss-at-ready")
			time.Sleep(vmSettle)
			b.ReportMetric(q.rssPerVM(b), "MiB-rss-per-vm")
		}
	})
	b.Run("scale-up=10", func(b *testing.B) {
		for range b.N {
			q := startQEMU(b)
			took := q.scaleUp(b, 10)
			b.ReportMetric(took.Seconds(), "s-to-ready")
			b.ReportMetric(10/took.Seconds(), "vms/s")
			time.Sleep(vmSettle)
			b.ReportMetric(q.rssPerVM(b), "MiB-rss-per-vm")
		}
	})
	b.Run("rolling-upgrade=5", func(b *testing.B) {
		for range b.N {
			q := startQEMU(b)
			b.ReportMetric(q.rollingUpgrade(b, 5).Seconds(), "s-to-upgraded")
		}
	})
}

// vmSettle is how long VMs run after they are ready before their memory is
// read: the guests hand back the pages they freed (free page reporting)
// within seconds.
const vmSettle = 30 * time.Second

// qemuBench is a control plane, a manager and a qemu provider of one
// benchmark run.
type qemuBench struct {
	ns  string
	dir string
	// ctx ends with the run, and the watches with it.
	ctx context.Context
}

func startQEMU(b *testing.B) *qemuBench {
	// kube-controller-manager signs the machines' certificates.
	e := freshEnv(b, testenv.Options{ControllerManager: true, NodeMonitorGracePeriod: 40 * time.Second})
	bin, err := testenv.Machinist()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	p, err := qemu.New(qemu.Options{StateDir: dir, GuestBinary: bin})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = p.Stop(ctx)
	})
	registry := providers.NewRegistry()
	if err := registry.Register(qemu.Name, p); err != nil {
		b.Fatal(err)
	}
	ctrls, err := e.StartControllers(manager.Options{
		Actuators: registry, MachineWorkers: 16,
		Backoff: machine.Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second},
	}, testenv.Leases{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := ctrls.Stop(); err != nil {
			b.Error(err)
		}
	})
	ns := e.NewNamespace(b, "qemu")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"},
		Spec: machinistv1.MachineClassSpec{Provider: qemu.Name,
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"cpus":1,"memory":"256Mi"}`)}},
	}
	if err := e.Client.Create(context.Background(), class); err != nil {
		b.Fatal(err)
	}
	watches, stop := context.WithCancel(context.Background())
	b.Cleanup(stop)
	return &qemuBench{ns: ns, dir: dir, ctx: watches}
}

// ready is a Machine on its template's version whose Node is healthy.
func readyOn(version string) func(*machinistv1.Machine) bool {
	return func(m *machinistv1.Machine) bool {
		return m.Spec.Version == version && m.Status.Phase == machinistv1.MachineRunning && m.DeletionTimestamp.IsZero() &&
			meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
	}
}

// scaleUp creates a MachineSet of n VMs and times it until every one's
// Node is healthy.
func (q *qemuBench) scaleUp(b *testing.B, n int) time.Duration {
	ctx := q.ctx
	labels := map[string]string{"pool": "vms"}
	set := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: q.ns, Name: "vms"},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(n)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "vm"}, Version: "v1.37.1"},
			},
		},
	}
	done, _, err := watchUntil(ctx, q.ns, n, readyOn("v1.37.1"))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := env.Client.Create(ctx, set); err != nil {
		b.Fatal(err)
	}
	wait(b, done, 15*time.Minute, "the VMs")
	return time.Since(start)
}

// rollingUpgrade makes a MachineDeployment of n VMs, then times the
// upgrade of all to a new version (maxSurge 1, maxUnavailable 0).
func (q *qemuBench) rollingUpgrade(b *testing.B, n int) time.Duration {
	ctx := q.ctx
	surge, unavailable := intstr.FromInt32(1), intstr.FromInt32(0)
	md := benchDeployment(q.ns, n, machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable}})
	md.Spec.Template.Spec.ClassRef = machinistv1.ClassReference{Name: "vm"}
	before, _, err := watchUntil(ctx, q.ns, n, readyOn(md.Spec.Template.Spec.Version))
	if err != nil {
		b.Fatal(err)
	}
	if err := env.Client.Create(ctx, md); err != nil {
		b.Fatal(err)
	}
	wait(b, before, 15*time.Minute, "the first version")
	after, _, err := watchUntil(ctx, q.ns, n, readyOn("v1.37.2"))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		b.Fatal(err)
	}
	md.Spec.Template.Spec.Version = "v1.37.2"
	if err := env.Client.Update(ctx, md); err != nil {
		b.Fatal(err)
	}
	wait(b, after, 20*time.Minute, "the upgrade")
	return time.Since(start)
}

// rssPerVM is the mean resident memory of the provider's QEMU processes,
// in MiB: what a VM costs the host.
func (q *qemuBench) rssPerVM(b *testing.B) float64 {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var total float64
	n := 0
	for _, f := range cmdlines {
		cmdline, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(cmdline), "qemu-system") || !strings.Contains(string(cmdline), q.dir+"/") {
			continue
		}
		status, err := os.ReadFile(filepath.Join(filepath.Dir(f), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				total += kb / 1024
				n++
			}
		}
	}
	if n == 0 {
		b.Fatal("no QEMU process found")
	}
	return total / float64(n)
}
