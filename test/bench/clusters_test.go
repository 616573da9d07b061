package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// BenchmarkScaleUpAcrossClusters scales up 1,000 Machines three ways, each
// on a control plane of its own with a manager process of its own: with
// their Nodes in the management cluster itself (no clusterName), all in
// one workload cluster, and spread over ten workload clusters of 100
// Machines each served by the one manager. The cases run one after the
// other rather than at once: on a small machine they would share the
// CPU, and neither their times nor their write counts nor the manager's
// memory would then be their own. Each case has the same fleet, so the
// differences between them are what serving clusters costs; the
// manager's heap with 0, 1 and 10 clusters connected, idle and after the
// scale-up, gives the memory a connection costs.
//
// BENCH_CLUSTER_MACHINES sets the fleet's size (1,000 unless set) and
// BENCH_CLUSTERS the cases (0,1,10 unless set): BENCH_CLUSTER_MACHINES=10000
// BENCH_CLUSTERS=0,10 compares ten workload clusters of 1,000 with one
// self-managed cluster of 10,000.
func BenchmarkScaleUpAcrossClusters(b *testing.B) {
	n := sizes(b, "BENCH_CLUSTER_MACHINES", 1000)[0]
	// Later cases report their memory against earlier ones'.
	seen := map[int]memory{}
	for _, k := range sizes(b, "BENCH_CLUSTERS", 0, 1, 10) {
		b.Run(fmt.Sprintf("clusters=%d", k), func(b *testing.B) {
			for range b.N {
				seen[k] = scaleAcross(b, n, k, seen)
			}
		})
	}
}

// memory is the manager's memory at two moments of a case: idle (warmed
// up, before the scale-up) and settled (every Machine Running).
type memory struct{ idle, settled memSample }

// memSample is the manager's memory at one moment: its live heap right
// after a forced collection, which varies little from one moment to the
// next, its resident set, and its goroutines.
type memSample struct {
	heap, rss  float64
	goroutines float64
}

// workload is one workload cluster of a case: its control plane, the
// WorkloadCluster naming it, and an admin clientset to read its counts.
type workload struct {
	name string
	e    *testenv.Env
	kube kubernetes.Interface
}

func scaleAcross(b *testing.B, n, k int, earlier map[int]memory) memory {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(b, true)
	clusters := startWorkloads(b, k)
	f.start(b)
	f.warm(ctx, b)

	ns := env.NewNamespace(b, "across")
	if err := f.e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	ever := countCreated(ctx, b, ns)
	// One Machine in each workload cluster first, so that its connection
	// (the first answer, the cache's sync) and its first join are not
	// timed: the same warm-up the manager's own cluster gets.
	for _, w := range clusters {
		serveCluster(ctx, b, ns, w)
	}
	if k > 0 {
		warmed, _, err := watchUntil(ctx, ns, k, running)
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range clusters {
			createClusterSet(ctx, b, ns, "warm-"+w.name, w.name, 1)
		}
		wait(b, warmed, 3*time.Minute, fmt.Sprintf("one Machine Running in each of %d workload clusters", k))
	}
	// A quiet spell, for the warm-up's trailing reconciles and the
	// WorkloadClusters' first status writes.
	time.Sleep(5 * time.Second)
	idle := f.sample(b)

	mgmtBefore, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	wlBefore := readAll(ctx, b, clusters)
	reqBefore := f.requestsByHost(b)
	cpu0 := f.cpu(b)
	kcm0 := cpuByName("kube-controller-manager")
	tr, err := trackClusters(ctx, ns)
	if err != nil {
		b.Fatal(err)
	}
	done, _, err := watchUntil(ctx, ns, n+k, running)
	if err != nil {
		b.Fatal(err)
	}
	profiled := f.profile(b, fmt.Sprintf("across-%d", k))

	if k == 0 {
		tr.expect("", n)
	}
	for _, w := range clusters {
		tr.expect(w.name, n/k)
	}

	b.ResetTimer()
	start := time.Now()
	tr.setStart(start)
	if k == 0 {
		if err := env.Client.Create(ctx, clusterDeployment(ns, "bench", "", n)); err != nil {
			b.Fatal(err)
		}
	}
	for _, w := range clusters {
		if err := env.Client.Create(ctx, clusterDeployment(ns, "bench-"+w.name, w.name, n/k)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(timeout(n)):
		b.Fatalf("not every Machine was Running after %s: %s", timeout(n), tr.progress())
	}
	engine := time.Since(start)
	used := f.cpu(b).since(cpu0)
	kcm := cpuByName("kube-controller-manager")["kube-controller-manager"] - kcm0["kube-controller-manager"]
	profiled()
	mgmtAfter := finalWrites(ctx, b, f.kube)
	wlAfter := readAll(ctx, b, clusters)
	requests := since(f.requestsByHost(b), reqBefore)
	mgmtURL, err := url.Parse(f.e.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	requests.split(mgmtURL.Host)
	peakHeap, liveHeap := f.heap()
	peakRSS := processPeakRSS(b, f.pid())
	settled := f.sample(b)
	f.heapProfile(fmt.Sprintf("across-%d", k))
	exact(ctx, b, ns, n+k, ever)

	mgmt := mgmtAfter.Done.Since(mgmtBefore.Done)
	wl := testenv.Writes{}
	var perCluster []string
	for i, w := range clusters {
		d := wlAfter[i].Done.Since(wlBefore[i].Done)
		for r, v := range d {
			wl[r] += v
		}
		perCluster = append(perCluster, fmt.Sprintf("%s %.0f", w.name, sum(d)))
	}
	// Where a Machine's Node lives the writes are the same resources in
	// either case: summed over every API server, they compare.
	all := testenv.Writes{}
	for _, w := range []testenv.Writes{mgmt, wl} {
		for r, v := range w {
			all[r] += v
		}
	}
	per := func(v float64) float64 { return v / float64(n) }

	b.ReportMetric(engine.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/engine.Seconds(), "machines/s")
	first, last := tr.spread()
	b.ReportMetric(first.Seconds(), "first-cluster-done-s")
	b.ReportMetric(last.Seconds(), "last-cluster-done-s")
	b.ReportMetric(per(all.Sum("machines", "machines/status")), "machine-writes/machine")
	b.ReportMetric(per(all.Sum("machinesets", "machinesets/status", "machinedeployments", "machinedeployments/status")), "set-writes/machine")
	b.ReportMetric(all.Sum("workloadclusters", "workloadclusters/status"), "workloadcluster-writes")
	b.ReportMetric(per(mgmt.Sum("events")), "mgmt-events/machine")
	b.ReportMetric(per(wl.Sum("events")), "workload-events/machine")
	b.ReportMetric(per(all.Sum("nodes", "nodes/status")), "node-writes/machine")
	b.ReportMetric(per(all.Sum("leases")), "lease-writes/machine")
	b.ReportMetric(per(all.Sum("secrets")), "token-writes/machine")
	b.ReportMetric(per(all.Sum("certificatesigningrequests", "certificatesigningrequests/approval", "certificatesigningrequests/status")), "csr-writes/machine")
	b.ReportMetric(per(sum(mgmt)), "mgmt-writes/machine")
	b.ReportMetric(per(sum(wl)), "workload-writes/machine")
	b.ReportMetric(per(requests.toManagement), "manager-requests-mgmt/machine")
	b.ReportMetric(per(requests.toWorkloads), "manager-requests-workload/machine")
	used.report(b)
	b.ReportMetric(kcm.Seconds(), "kube-controller-manager-cpu-s")
	b.ReportMetric(idle.heap/(1<<20), "manager-idle-heap-MiB")
	b.ReportMetric(idle.rss/(1<<20), "manager-idle-RSS-MiB")
	b.ReportMetric(idle.goroutines, "manager-idle-goroutines")
	b.ReportMetric(settled.heap/(1<<20), "manager-settled-heap-MiB")
	b.ReportMetric(settled.rss/(1<<20), "manager-settled-RSS-MiB")
	b.ReportMetric(settled.goroutines, "manager-settled-goroutines")
	b.ReportMetric(float64(peakRSS)/(1<<20), "manager-peak-RSS-MiB")
	b.ReportMetric(peakHeap/(1<<20), "manager-peak-heap-MiB")
	b.ReportMetric(liveHeap/(1<<20), "manager-peak-live-heap-MiB")
	// What a connection costs: the difference from the case with none,
	// per cluster connected, at the same number of Machines.
	if none, ok := earlier[0]; ok && k > 0 {
		b.ReportMetric((idle.heap-none.idle.heap)/float64(k)/(1<<20), "idle-heap-MiB/cluster")
		b.ReportMetric((idle.rss-none.idle.rss)/float64(k)/(1<<20), "idle-RSS-MiB/cluster")
		b.ReportMetric((idle.goroutines-none.idle.goroutines)/float64(k), "idle-goroutines/cluster")
		b.ReportMetric((settled.heap-none.settled.heap)/float64(k)/(1<<20), "settled-heap-MiB/cluster")
		b.ReportMetric((settled.rss-none.settled.rss)/float64(k)/(1<<20), "settled-RSS-MiB/cluster")
	}
	if one, ok := earlier[1]; ok && k > 1 {
		b.Logf("clusters=%d against clusters=1, per further cluster: idle heap %+.2f MiB, RSS %+.2f MiB, %+.1f goroutines; settled heap %+.2f MiB, RSS %+.2f MiB",
			k, (idle.heap-one.idle.heap)/float64(k-1)/(1<<20), (idle.rss-one.idle.rss)/float64(k-1)/(1<<20),
			(idle.goroutines-one.idle.goroutines)/float64(k-1),
			(settled.heap-one.settled.heap)/float64(k-1)/(1<<20), (settled.rss-one.settled.rss)/float64(k-1)/(1<<20))
	}
	b.Logf("clusters=%d: management writes %v; refused %v", k, mgmt, mgmtAfter.Refused.Since(mgmtBefore.Refused))
	b.Logf("clusters=%d: workload writes, all clusters %v", k, wl)
	if len(perCluster) > 1 {
		// One line: go test keeps only the first lines a benchmark logs.
		b.Logf("clusters=%d: writes by cluster: %s", k, strings.Join(perCluster, ", "))
	}
	b.Logf("clusters=%d: the manager's requests by API server and method %v", k, requests.byHost)
	b.Logf("clusters=%d: all Running by cluster at %s", k, tr.doneTimes())
	return memory{idle: idle, settled: settled}
}

func running(m *machinistv1.Machine) bool {
	return m.Status.Phase == machinistv1.MachineRunning && m.DeletionTimestamp.IsZero()
}

// startWorkloads starts k workload clusters, a few at a time: each start
// (etcd, kube-apiserver, kube-controller-manager) is CPU-heavy, and ten at
// once on two cores would run past testenv's start timeout.
func startWorkloads(b *testing.B, k int) []workload {
	out := make([]workload, k)
	errs := make([]error, k)
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			e, err := testenv.StartWith(testenv.Options{Workload: true})
			if err != nil {
				errs[i] = fmt.Errorf("workload cluster %d: %w", i, err)
				return
			}
			kube, err := kubernetes.NewForConfig(e.Config)
			if err != nil {
				errs[i] = err
			}
			out[i] = workload{name: fmt.Sprintf("wc-%02d", i), e: e, kube: kube}
		})
	}
	wg.Wait()
	// Stopped together: each kube-apiserver may take up to a minute to
	// close its machines' watches, and one after another would add ten.
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, w := range out {
			if w.e != nil {
				wg.Go(func() { _ = w.e.Stop() })
			}
		}
		wg.Wait()
	})
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return out
}

// serveCluster makes the WorkloadCluster for w in ns, from its admin
// kubeconfig in a Secret shaped as Cluster API shapes them.
func serveCluster(ctx context.Context, b *testing.B, ns string, w workload) {
	kubeconfig, err := os.ReadFile(w.e.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := testenv.RegisterCluster(ctx, env.Client, ns, w.name, kubeconfig); err != nil {
		b.Fatal(err)
	}
}

// createClusterSet creates a MachineSet of n Machines of class "small" in
// the named cluster ("" for the management cluster).
func createClusterSet(ctx context.Context, b *testing.B, ns, name, cluster string, n int) {
	labels := map[string]string{"pool": name}
	ms := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(n)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, ClusterName: cluster},
			},
		},
	}
	if err := env.Client.Create(ctx, ms); err != nil {
		b.Fatal(err)
	}
}

// clusterDeployment is BenchmarkScaleUp's MachineDeployment, named and
// selecting by name so that several share a namespace, its Machines in
// the named cluster ("" for the management cluster).
func clusterDeployment(ns, name, cluster string, n int) *machinistv1.MachineDeployment {
	md := benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{})
	labels := map[string]string{"pool": name}
	md.Name = name
	md.Spec.Selector.MatchLabels = labels
	md.Spec.Template.Metadata.Labels = labels
	md.Spec.Template.Spec.ClusterName = cluster
	return md
}

func readAll(ctx context.Context, b *testing.B, clusters []workload) []testenv.Counts {
	out := make([]testenv.Counts, len(clusters))
	for i, w := range clusters {
		c, err := testenv.ReadWrites(ctx, w.kube)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = c
	}
	return out
}

func sum(w testenv.Writes) float64 {
	var n float64
	for _, v := range w {
		n += v
	}
	return n
}

// sample forces a collection in the manager (through its pprof heap
// endpoint, gc=1) and reads the heap it left, its resident set and its
// goroutines.
func (f *fleet) sample(b *testing.B) memSample {
	resp, err := http.Get("http://" + f.pprof + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	m := heapAlloc.FindSubmatch(text)
	if m == nil {
		b.Fatalf("no HeapAlloc in the manager's heap profile")
	}
	heap, _ := strconv.ParseFloat(string(m[1]), 64)
	rss, err := statusBytes(fmt.Sprintf("/proc/%d/status", f.pid()), "VmRSS:")
	if err != nil {
		b.Fatal(err)
	}
	metrics, err := f.scrape()
	if err != nil {
		b.Fatal(err)
	}
	return memSample{heap: heap, rss: float64(rss), goroutines: metrics["go_goroutines"]}
}

// heapAlloc is the live heap in the runtime.MemStats that a debug=1 heap
// profile ends with.
var heapAlloc = regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)$`)

// statusBytes reads one of the kB fields (VmRSS:, VmHWM:) of a
// /proc/<pid>/status file, in bytes.
func statusBytes(status, field string) (int64, error) {
	data, err := os.ReadFile(status)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in %s", field, status)
}

// requests are the manager's own API requests (client-go's
// rest_client_requests_total), reads included, by API server.
type requests struct {
	byHost                    map[string]float64
	toManagement, toWorkloads float64
}

// requestsByHost reads the manager's rest_client_requests_total by host
// and method; reads count, since each cluster's rate limit spends on them
// as on writes.
func (f *fleet) requestsByHost(b *testing.B) map[string]float64 {
	resp, err := http.Get("http://" + f.metrics + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range families["rest_client_requests_total"].GetMetric() {
		var host, method string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "host":
				host = l.GetValue()
			case "method":
				method = l.GetValue()
			}
		}
		out[host+" "+method] += m.GetCounter().GetValue()
	}
	return out
}

// since is the manager's requests between before and now, split into
// those to the management cluster and those to the workload clusters.
func since(now, before map[string]float64) requests {
	r := requests{byHost: map[string]float64{}}
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			r.byHost[k] = d
		}
	}
	return r
}

// split divides the requests by the management cluster's host.
func (r *requests) split(mgmtHost string) {
	for k, v := range r.byHost {
		if strings.HasPrefix(k, mgmtHost+" ") {
			r.toManagement += v
		} else {
			r.toWorkloads += v
		}
	}
}

// clusterTracker records when each cluster's Machines were all Running.
type clusterTracker struct {
	mu      sync.Mutex
	start   time.Time
	running map[string]map[string]bool // by cluster, then Machine
	want    map[string]int
	done    map[string]time.Duration
}

// trackClusters follows the Machines of ns created from now on (those of
// the sets named bench*), by cluster.
func trackClusters(ctx context.Context, ns string) (*clusterTracker, error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, err
	}
	t := &clusterTracker{running: map[string]map[string]bool{}, want: map[string]int{}, done: map[string]time.Duration{}}
	go func() {
		for ev := range events {
			m, ok := ev.Object.(*machinistv1.Machine)
			if !ok || !strings.HasPrefix(m.Labels["pool"], "bench") {
				continue
			}
			t.see(m, ev.Type == watch.Deleted)
		}
	}()
	return t, nil
}

// expect says how many Machines the named cluster will have.
func (t *clusterTracker) expect(cluster string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.want[cluster] = n
}

func (t *clusterTracker) setStart(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = start
}

func (t *clusterTracker) see(m *machinistv1.Machine, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := m.Spec.ClusterName
	if t.running[c] == nil {
		t.running[c] = map[string]bool{}
	}
	if !deleted && running(m) {
		t.running[c][m.Name] = true
	} else {
		delete(t.running[c], m.Name)
	}
	if _, done := t.done[c]; !done && t.want[c] > 0 && len(t.running[c]) == t.want[c] {
		t.done[c] = time.Since(t.start)
	}
}

// progress says how many Machines are Running in each cluster.
func (t *clusterTracker) progress() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for c, r := range t.running {
		parts = append(parts, fmt.Sprintf("%q: %d Running", c, len(r)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// spread is when the first and the last cluster had all their Machines
// Running.
func (t *clusterTracker) spread() (first, last time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, d := range t.done {
		if first == 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	return first, last
}

func (t *clusterTracker) doneTimes() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for c, d := range t.done {
		parts = append(parts, fmt.Sprintf("%q %.1fs", c, d.Seconds()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
