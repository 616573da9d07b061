package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
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

// BenchmarkScaleUp times a MachineDeployment going from 0 to N Machines,
// all Running, with a zero-latency inmemory provider served out of
// process and the manager in a process of its own, and in the same run two
// write floors: the Machine writes alone (a create and two status updates
// per Machine), and the full mix the engine's run made (those, plus as
// many Events, Node and Lease writes and set writes), each made directly
// by a client with the engine's parallelism. Over the fleet it built it
// then restarts the manager twice, the second time with one Machine's spec
// changed while it was down, and times kubectl.
//
// The sizes are BENCH_SCALE's, comma-separated, 1,000, 10,000 and 20,000
// unless set.
func BenchmarkScaleUp(b *testing.B) {
	for _, n := range sizes(b, "BENCH_SCALE", 1000, 10000, 20000) {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			for range b.N {
				scaleUp(b, n)
			}
		})
	}
}

// sizes reads a comma-separated list of counts from the environment
// variable name, or returns defaults when it is unset.
func sizes(b *testing.B, name string, defaults ...int) []int {
	v := os.Getenv(name)
	if v == "" {
		return defaults
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: want counts separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
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
	ns := env.NewNamespace(b, prefix)
	if err := e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	return kube, ctrls, ns
}

func scaleUp(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(b, true)
	ns, ever, running := f.scaleNamespace(ctx, b, n)
	before, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := f.cpu(b)
	profiled := f.profile(b, fmt.Sprintf("scale-%d", n))

	b.ResetTimer()
	start := time.Now()
	md := benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{})
	if err := env.Client.Create(ctx, md); err != nil {
		b.Fatal(err)
	}
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
	used := f.cpu(b).since(cpu0)
	profiled()
	after := finalWrites(ctx, b, f.kube)
	peakHeap, liveHeap := f.heap()
	rss := processPeakRSS(b, f.pid())
	settled, err := f.scrape()
	if err != nil {
		b.Fatal(err)
	}
	w := after.Done.Since(before.Done)
	f.heapProfile(fmt.Sprintf("scale-%d", n))
	exact(ctx, b, ns, n, ever)

	// Every Machine, the warm-up's too, is reconciled once after a restart.
	plain := f.restart(ctx, b, n+1, nil)
	changed := f.restart(ctx, b, n+1, func() {
		var list machinistv1.MachineList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.Limit(1)); err != nil || len(list.Items) == 0 {
			b.Fatalf("listing a Machine to change: %v", err)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"nodeLabels":{"bench":"restarted"}}}`))
		if err := env.Client.Patch(ctx, &list.Items[0], patch); err != nil {
			b.Fatal(err)
		}
	})
	kubectl := timeKubectl(ctx, b, f, ns, md.Name)
	f.stop(b)

	floor := runUnits(ctx, b, floorClient(b), env.NewNamespace(b, "floor"), n, createUnit)
	mix, replayed := mixFloor(ctx, b, n, nil, createUnit, createWrites(n), w)

	b.ReportMetric(engine.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/engine.Seconds(), "machines/s")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/machine")
	b.ReportMetric(w.Sum("events")/float64(n), "events/machine")
	b.ReportMetric(w.Sum("nodes", "nodes/status", "leases")/float64(n), "provider-writes/machine")
	b.ReportMetric(floor.Seconds(), "floor-s")
	b.ReportMetric(engine.Seconds()/floor.Seconds(), "engine/floor")
	b.ReportMetric(mix.Seconds(), "mix-floor-s")
	b.ReportMetric(engine.Seconds()/mix.Seconds(), "engine/mix-floor")
	used.report(b)
	b.ReportMetric(float64(rss)/(1<<20), "manager-peak-RSS-MiB")
	b.ReportMetric(peakHeap/(1<<20), "manager-peak-heap-MiB")
	b.ReportMetric(liveHeap/(1<<20), "manager-peak-live-heap-MiB")
	b.ReportMetric(settled["go_memstats_heap_inuse_bytes"]/(1<<20), "manager-settled-heap-MiB")
	// Each a look at all of the set's or deployment's Machines: what
	// pacing bounds.
	b.ReportMetric(settled["controller_runtime_reconcile_total/machineset"], "machineset-reconciles")
	b.ReportMetric(settled["controller_runtime_reconcile_total/machinedeployment"], "deployment-reconciles")
	b.ReportMetric(plain.took.Seconds(), "restart-s")
	b.ReportMetric(plain.engineWrites(), "restart-writes")
	b.ReportMetric(changed.took.Seconds(), "restart-changed-s")
	b.ReportMetric(changed.engineWrites(), "restart-changed-writes")
	for _, k := range kubectl {
		b.ReportMetric(k.took.Seconds(), k.name+"-s")
	}
	b.Logf("N=%d: successful writes by resource %v; refused writes %v; full-mix floor replayed %v", n, w, after.Refused.Since(before.Refused), replayed)
	b.Logf("N=%d: restart wrote %v; restart with one Machine changed wrote %v", n, plain.writes, changed.writes)
	b.Logf("N=%d: refused writes by resource, verb and code since the control plane started: %v", n, refusedByCode(ctx, b, f.kube))
}

// refusedByCode lists kube-apiserver's refused writes by resource, verb
// and status code, so that a refusal's cause can be told apart.
func refusedByCode(ctx context.Context, b *testing.B, kube kubernetes.Interface) []string {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || strings.Contains(line, `code="2`) {
			continue
		}
		for _, verb := range []string{`verb="POST"`, `verb="PUT"`, `verb="PATCH"`, `verb="DELETE"`} {
			if strings.Contains(line, verb) {
				out = append(out, line[len("apiserver_request_total"):])
			}
		}
	}
	return out
}

// restarted is what a manager's restart over a settled fleet cost.
type restarted struct {
	// took is from the new process's start until every Machine had been
	// reconciled once and the Machine queue was empty.
	took time.Duration
	// writes are the API server's successful writes from the stop until
	// 5 s after that.
	writes testenv.Writes
}

// restart stops the manager, runs during (if any) while it is down, starts
// it again and measures what it costs until each of the machines has been
// reconciled once, and the writes made until 5 s later.
func (f *fleet) restart(ctx context.Context, b *testing.B, machines int, during func()) restarted {
	f.stop(b)
	if during != nil {
		during()
	}
	before, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	f.start(b)
	var took time.Duration
	for deadline := start.Add(timeout(machines)); ; {
		m, err := f.scrape()
		if err == nil && m["controller_runtime_reconcile_total/machine"] >= float64(machines) && m["workqueue_depth/machine"] == 0 {
			took = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the Machines were not all reconciled %s after a restart: %v", timeout(machines), m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A quiet spell for the restart's trailing writes to land before
	// counting: nothing shows when they are over.
	time.Sleep(5 * time.Second)
	after, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	return restarted{took: took, writes: after.Done.Since(before.Done)}
}

// engineWrites are the restart's writes but Leases: the manager runs
// without leader election here and the node agents renew hourly, so a
// Lease written meanwhile is kube-apiserver's own, which it renews every
// 10 s in kube-system.
func (r restarted) engineWrites() float64 {
	var n float64
	for k, v := range r.writes {
		if k != "leases" {
			n += v
		}
	}
	return n
}

func keys(w testenv.Writes) []string {
	var out []string
	for k := range w {
		out = append(out, k)
	}
	return out
}

// timed is how long one kubectl command took (the median of three).
type timed struct {
	name string
	took time.Duration
}

// timeKubectl times, three times each, the kubectl commands a person runs
// against a fleet: the Machines' table, the rollout's status, and every
// Machinist object (the category), keeping each one's median; and, for
// comparison, the table of as many built-in objects (the Nodes).
func timeKubectl(ctx context.Context, b *testing.B, f *fleet, ns, deployment string) []timed {
	plugin := filepath.Join(filepath.Dir(f.bin), "kubectl-machine")
	if _, err := os.Stat(plugin); err != nil {
		if err := testenv.Build("./cmd/kubectl-machine", plugin); err != nil {
			b.Fatal(err)
		}
	}
	kubectl := filepath.Join(testenv.BinDir(), "kubectl")
	commands := []struct {
		name string
		args []string
	}{
		{"kubectl-get-machines", []string{"get", "machines", "-n", ns}},
		{"kubectl-rollout-status", []string{"machine", "rollout", "status", deployment, "-n", ns}},
		{"kubectl-get-machinist", []string{"get", "machinist", "-n", ns}},
		// For comparison: as many built-in objects, the fleet's Nodes.
		{"kubectl-get-nodes", []string{"get", "nodes"}},
	}
	var out []timed
	for _, c := range commands {
		var runs []time.Duration
		for range 3 {
			// kubectl takes no flags before a plugin's name.
			cmd := exec.CommandContext(ctx, kubectl, append(c.args, "--kubeconfig", f.e.Kubeconfig)...)
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(plugin)+":"+os.Getenv("PATH"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			stdout, err := cmd.Output()
			took := time.Since(start)
			if err != nil {
				b.Fatalf("%s: %v: %s", c.name, err, stderr.String())
			}
			if len(stdout) == 0 {
				b.Fatalf("%s printed nothing", c.name)
			}
			runs = append(runs, took)
		}
		slices.Sort(runs)
		out = append(out, timed{name: c.name, took: runs[1]})
	}
	return out
}

// timeout allows a generous 0.5s a Machine, at least two minutes.
func timeout(n int) time.Duration { return max(2*time.Minute, time.Duration(n)*500*time.Millisecond) }

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

// finalWrites stops the benchmark's timer and reads the API server's
// write counts once the trailing status writes and Events have landed.
func finalWrites(ctx context.Context, b *testing.B, kube kubernetes.Interface) testenv.Counts {
	b.StopTimer()
	// A quiet spell: nothing shows when the trailing writes are over.
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
func vmHWM(status string) (int64, error) { return statusBytes(status, "VmHWM:") }

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
