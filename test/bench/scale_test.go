package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/manager"
	"github.com/machinist-dev/machinist/internal/testenv"
)

// The engine and the floor client run with the same parallelism and the
// same client rate limits, so their times compare.
const (
	workers = 32
	qps     = 2000
	burst   = 4000
)

// env is the control plane of the benchmark running now.
var env *testenv.Env

// freshEnv starts a control plane of the benchmark's own (with opts), so
// that objects a previous benchmark left behind cannot load the
// controllers it measures, and stops it when the benchmark ends.
func freshEnv(b *testing.B, opts testenv.Options) *testenv.Env {
	e, err := testenv.StartWith(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Stop() })
	env = e
	return e
}

// BenchmarkScaleUp times a MachineSet going from 0 to N Machines, all
// Running, with a zero-latency inmemory provider, and in the same run the
// API server's write floor: the same number of Machine writes (a create and
// two status updates per Machine) made directly by a client with the same
// parallelism.
func BenchmarkScaleUp(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			for range b.N {
				scaleUp(b, n)
			}
		})
	}
}

// setUp starts a control plane of the benchmark's own, the controllers
// with an inmemory provider, and a namespace with a MachineClass "small".
func setUp(ctx context.Context, b *testing.B, prefix string) (kubernetes.Interface, *testenv.Controllers, string) {
	// Leases renewed rarely: kubelet heartbeats are the provider's load,
	// not the engine's, and would blur the write counts.
	return startControllers(ctx, b, freshEnv(b, testenv.Options{}), prefix, manager.Options{},
		testenv.Leases{DurationSeconds: 3600, RenewInterval: time.Hour})
}

// startControllers starts the controllers on e with the benchmarks'
// workers and client limits over opts, and a namespace holding the
// MachineClass "small".
func startControllers(ctx context.Context, b *testing.B, e *testenv.Env, prefix string, opts manager.Options, leases testenv.Leases) (kubernetes.Interface, *testenv.Controllers, string) {
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		b.Fatal(err)
	}
	resetPeakRSS()
	opts.MachineWorkers, opts.MachineSetWorkers, opts.QPS, opts.Burst, opts.Repeatable = workers, 4, qps, burst, true
	ctrls, err := e.StartControllers(opts, leases)
	if err != nil {
		b.Fatal(err)
	}
	ns := namespace(ctx, b, prefix)
	if err := e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	return kube, ctrls, ns
}

func scaleUp(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, ctrls, ns := setUp(ctx, b, "scale")
	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	createSet(ctx, b, ns, n)
	select {
	case <-running:
	case <-time.After(timeout(n)):
		var list machinistv1.MachineList
		_ = env.Client.List(ctx, &list, client.InNamespace(ns))
		phases := map[machinistv1.MachinePhase]int{}
		for _, m := range list.Items {
			phases[m.Status.Phase]++
		}
		b.Fatalf("not every Machine was Running after %s: %d Machines by phase %v", timeout(n), len(list.Items), phases)
	}
	engine := time.Since(start)
	after := finalWrites(ctx, b, kube)
	rss := peakRSS()
	if err := ctrls.Stop(); err != nil {
		b.Fatal(err)
	}
	floor := writeFloor(ctx, b, n)

	w := after.Done.Since(before.Done)
	objectWrites := w.Sum("machines", "machines/status", "machinesets", "machinesets/status")
	b.ReportMetric(engine.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/engine.Seconds(), "machines/s")
	b.ReportMetric(objectWrites/float64(n), "writes/machine")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/machine")
	b.ReportMetric(w.Sum("machinesets/status"), "machineset-status-writes")
	b.ReportMetric(w.Sum("events")/float64(n), "events/machine")
	b.ReportMetric(w.Sum("nodes", "nodes/status", "leases", "pods", "pods/status")/float64(n), "provider-writes/machine")
	b.ReportMetric(floor.Seconds(), "floor-s")
	b.ReportMetric(engine.Seconds()/floor.Seconds(), "engine/floor")
	b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MiB")
	b.Logf("N=%d: successful writes by resource %v; refused writes %v", n, w, after.Refused.Since(before.Refused))
}

// timeout allows a generous 0.5s a Machine, at least two minutes.
func timeout(n int) time.Duration { return max(2*time.Minute, time.Duration(n)*500*time.Millisecond) }

// writeFloor makes n Machine creates and 2n status updates (Provisioning,
// then Running) directly, with the engine's parallelism, and times them.
func writeFloor(ctx context.Context, b *testing.B, n int) time.Duration {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = qps, burst
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	ns := namespace(ctx, b, "floor")
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				m := &machinistv1.Machine{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "floor-",
						Finalizers: []string{machinistv1.MachineFinalizer}},
					Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
				}
				if err := c.Create(ctx, m); err != nil {
					errs <- err
					return
				}
				for _, p := range []machinistv1.MachinePhase{machinistv1.MachineProvisioning, machinistv1.MachineRunning} {
					m.Status.Phase = p
					m.Status.ProviderID = "floor:///" + strconv.Itoa(i)
					if err := c.Status().Update(ctx, m); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	d := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return d
}

// watchRunning closes the returned channel once n Machines in ns are Running.
func watchRunning(ctx context.Context, ns string, n int) (<-chan struct{}, error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		running := map[string]bool{}
		for ev := range events {
			m, ok := ev.Object.(*machinistv1.Machine)
			if !ok {
				continue
			}
			if ev.Type != watch.Deleted && m.Status.Phase == machinistv1.MachineRunning {
				running[m.Name] = true
			} else {
				delete(running, m.Name)
			}
			if len(running) == n {
				close(done)
				return
			}
		}
	}()
	return done, nil
}

func namespace(ctx context.Context, b *testing.B, prefix string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	return ns.Name
}

// finalWrites stops the benchmark's timer and reads the API server's
// write counts once the trailing status writes and Events have landed.
func finalWrites(ctx context.Context, b *testing.B, kube kubernetes.Interface) testenv.Counts {
	b.StopTimer()
	time.Sleep(3 * time.Second)
	after, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}
	return after
}

// resetPeakRSS restarts the kernel's peak-RSS count for this process.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is this process's peak resident set (VmHWM) in bytes: the
// manager and the inmemory provider's machines, which run in it.
func peakRSS() int64 {
	n, _ := vmHWM("/proc/self/status")
	return n
}

// vmHWM reads the peak resident set (VmHWM), in bytes, from a
// /proc/<pid>/status file.
func vmHWM(status string) (int64, error) {
	data, err := os.ReadFile(status)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in %s", status)
}

// createSet creates the MachineSet "bench" of n Machines of class "small".
func createSet(ctx context.Context, b *testing.B, ns string, n int) {
	labels := map[string]string{"pool": "bench"}
	ms := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(n)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
			},
		},
	}
	if err := env.Client.Create(ctx, ms); err != nil {
		b.Fatal(err)
	}
}
