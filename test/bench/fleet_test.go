package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/orphans"
)

// fleet is a benchmark's control plane with `machinist manager` as a
// process of its own and, unless the provider runs inside the manager, the
// inmemory provider's node agents in another (`machinist provider serve`):
// the manager's CPU, heap and peak RSS are then its own. The manager can be
// stopped and started again over the same fleet.
type fleet struct {
	e        *testenv.Env
	kube     kubernetes.Interface
	provider *testenv.ServedProvider
	args     []string
	bin      string
	mgr      *exec.Cmd
	done     chan error
	out      *testenv.LockedBuffer
	// metrics and pprof are the manager's /metrics and /debug/pprof
	// addresses.
	metrics, pprof string
}

// managerBin is machinist-manager, the binary a deployed manager runs,
// built once for the benchmarks of this process.
var managerBin struct {
	sync.Mutex
	path string
}

// managerBinary builds cmd/machinist-manager once, into a directory that
// goes when the benchmarks end.
func managerBinary() (string, error) {
	managerBin.Lock()
	defer managerBin.Unlock()
	if managerBin.path != "" {
		return managerBin.path, nil
	}
	dir, err := os.MkdirTemp("", "machinist-manager-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "machinist-manager")
	if err := testenv.Build("./cmd/machinist-manager", path); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	managerBin.path = path
	return path, nil
}

// TestMain removes what the benchmarks built. The controllers some
// benchmarks run in process log nothing: their figures are the output.
func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	code := m.Run()
	if managerBin.path != "" {
		_ = os.RemoveAll(filepath.Dir(managerBin.path))
	}
	os.Exit(code)
}

// newFleet starts a control plane of the benchmark's own and, if served,
// the inmemory provider out of process; the manager is started by start.
// Leases are renewed hourly, as in setUp: heartbeats are the provider's
// load, not the engine's.
func newFleet(b *testing.B, served bool) *fleet {
	return newFleetOf(b, served, nil)
}

// newFleetOf is newFleet with the served inmemory provider p, started by
// the caller on the fleet's control plane (env); nil starts the usual one.
func newFleetOf(b *testing.B, served bool, serve func(*testenv.Env) *testenv.ServedProvider) *fleet {
	e := freshEnv(b, testenv.Options{})
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		b.Fatal(err)
	}
	bin, err := managerBinary()
	if err != nil {
		b.Fatal(err)
	}
	f := &fleet{e: e, kube: kube, bin: bin}
	f.args = []string{"--kubeconfig", e.Kubeconfig, "--health-probe-bind-address=0",
		"--machine-workers", strconv.Itoa(workers), "--set-workers=4",
		"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(burst), "--log-level=error"}
	switch {
	case serve != nil:
		f.provider = serve(e)
		f.args = append(f.args, "--provider=inmemory="+f.provider.Endpoint)
	case served:
		if f.provider, err = e.ServeProvider("inmemory", "--lease-duration-seconds=3600", "--renew-interval=1h", "--log-level=error"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = f.provider.Stop() })
		f.args = append(f.args, "--provider=inmemory="+f.provider.Endpoint)
	default:
		f.args = append(f.args, "--inmemory-lease-duration-seconds=3600", "--inmemory-renew-interval=1h")
	}
	b.Cleanup(func() { f.stop(b) })
	return f
}

// via has the manager reach kube-apiserver through the kubeconfig file
// at path (a fault proxy's) from its next start.
func (f *fleet) via(path string) {
	for i, a := range f.args {
		if a == "--kubeconfig" {
			f.args[i+1] = path
		}
	}
}

// start starts the manager and waits until it serves its metrics.
func (f *fleet) start(b *testing.B) {
	// The ports are chosen free and then released for the manager to
	// bind: a benchmark that loses that race fails, saying so, and is run
	// again; no test depends on it.
	f.metrics, f.pprof = "127.0.0.1:"+strconv.Itoa(testenv.FreePort(b)), "127.0.0.1:"+strconv.Itoa(testenv.FreePort(b))
	f.mgr = exec.Command(f.bin, append(f.args, "--metrics-bind-address="+f.metrics, "--pprof-bind-address="+f.pprof)...)
	// The heap's figures come from the collector's own trace (heap), not
	// from polling /metrics, which costs the manager a list of every
	// Machine each time (the phase gauge).
	f.mgr.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	f.out = &testenv.LockedBuffer{}
	f.mgr.Stdout, f.mgr.Stderr = f.out, f.out
	if err := f.mgr.Start(); err != nil {
		b.Fatal(err)
	}
	if err := orphans.Guard(f.mgr.Process.Pid); err != nil {
		b.Fatal(err)
	}
	f.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(f.mgr, f.done)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := f.scrape(); err == nil {
			return
		}
		select {
		case err := <-f.done:
			f.mgr = nil
			b.Fatalf("the manager exited (%v):\n%s", err, f.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("the manager served no metrics in a minute:\n%s", f.out.String())
		}
	}
}

// stop stops the manager, if it runs, as a Pod's termination would.
func (f *fleet) stop(b *testing.B) {
	if f.mgr == nil {
		return
	}
	// The manager logs errors only: any is worth seeing beside the
	// figures (the collector's trace lines are not errors).
	var errs []string
	for _, line := range strings.Split(f.out.String(), "\n") {
		if line != "" && !strings.HasPrefix(line, "gc ") && len(errs) < 10 {
			errs = append(errs, line)
		}
	}
	if len(errs) > 0 {
		b.Logf("the manager logged:\n%s", strings.Join(errs, "\n"))
	}
	_ = f.mgr.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(time.Minute):
		_ = f.mgr.Process.Kill()
		<-f.done
		b.Errorf("the manager did not stop in a minute on SIGTERM")
	}
	f.mgr = nil
}

// pid is the running manager's process ID.
func (f *fleet) pid() int { return f.mgr.Process.Pid }

// scrape reads the manager's /metrics, summing each metric's series by
// name and controller ("controller_runtime_reconcile_total/machine"), or
// by name and the label name when there is no controller label.
func (f *fleet) scrape() (map[string]float64, error) {
	resp, err := http.Get("http://" + f.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			key, queue := name, ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "controller":
					key += "/" + l.GetValue()
				case "name":
					queue = l.GetValue()
				}
			}
			if key == name && queue != "" {
				key += "/" + queue
			}
			switch {
			case m.GetCounter() != nil:
				out[key] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] += m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

// heap reads the manager's garbage collector trace (GODEBUG=gctrace=1):
// the largest heap it saw at the end of a collection, which is the peak
// of the heap to within what one cycle allocates, and the largest heap
// left live (marked) by one.
func (f *fleet) heap() (peak, live float64) {
	for _, m := range gcTrace.FindAllStringSubmatch(f.out.String(), -1) {
		end, _ := strconv.ParseFloat(m[2], 64)
		marked, _ := strconv.ParseFloat(m[3], 64)
		peak, live = max(peak, end), max(live, marked)
	}
	return peak * (1 << 20), live * (1 << 20)
}

// gcTrace matches a gctrace line's heap sizes: at the start of the
// collection, at its end, and marked live, in MiB.
var gcTrace = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB`)

// profile starts CPU profiles of the manager and of kube-apiserver when
// BENCH_PROFILES names a directory, and writes them there, named by what,
// once the returned function is called.
func (f *fleet) profile(b *testing.B, what string) (stop func()) {
	dir := os.Getenv("BENCH_PROFILES")
	if dir == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// A profile request cannot be ended early and keep what it gathered,
	// so each is taken in slices of 10 s until stopped.
	grab := func(name string, get func(seconds int) ([]byte, error)) {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				data, err := get(10)
				if err != nil || len(data) == 0 {
					return
				}
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%02d.pprof", what, name, i)), data, 0o644)
			}
		})
	}
	grab("manager", func(s int) ([]byte, error) {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", f.pprof, s))
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		return io.ReadAll(resp.Body)
	})
	grab("kube-apiserver", func(s int) ([]byte, error) {
		return f.kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(s)).Timeout(time.Minute).DoRaw(context.Background())
	})
	return func() { cancel(); wg.Wait() }
}

// heapProfile writes the manager's heap profile, named by what, when
// BENCH_PROFILES names a directory.
func (f *fleet) heapProfile(what string) {
	dir := os.Getenv("BENCH_PROFILES")
	if dir == "" {
		return
	}
	resp, err := http.Get("http://" + f.pprof + "/debug/pprof/heap")
	if err != nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if data, err := io.ReadAll(resp.Body); err == nil {
		_ = os.WriteFile(filepath.Join(dir, what+"-manager-heap.pprof"), data, 0o644)
	}
}

// cpu is CPU time by process: the manager, the provider (if served),
// kube-apiserver and etcd.
type cpu map[string]time.Duration

func (f *fleet) cpu(b *testing.B) cpu {
	c := cpu{"manager": processCPU(b, f.pid())}
	if f.provider != nil {
		c["provider"] = processCPU(b, f.provider.Cmd.Process.Pid)
	}
	for name, t := range cpuByName("kube-apiserver", "etcd") {
		c[name] = t
	}
	return c
}

func (c cpu) since(before cpu) cpu {
	out := cpu{}
	for k, v := range c {
		out[k] = v - before[k]
	}
	return out
}

// report adds each process's CPU seconds to the benchmark's metrics.
func (c cpu) report(b *testing.B) {
	for k, v := range c {
		b.ReportMetric(v.Seconds(), k+"-cpu-s")
	}
}

// cpuByName sums the CPU time of this process's children with each of
// names, by name: the control planes the benchmark started, not those of
// other tests that may share the machine.
func cpuByName(names ...string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, name := range names {
		// The kernel keeps 15 bytes of a command's name.
		for _, pid := range orphans.Children(name[:min(len(name), 15)]) {
			if t, err := pidCPU(pid); err == nil {
				out[name] += t
			}
		}
	}
	return out
}

// warm brings one Machine up first, so that the manager's start (cache
// sync, the first connection to the provider) is not timed.
func (f *fleet) warm(ctx context.Context, b *testing.B) {
	ns := env.NewNamespace(b, "warm")
	if err := f.e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	warmed, err := watchRunning(ctx, ns, 1)
	if err != nil {
		b.Fatal(err)
	}
	createSet(ctx, b, ns, 1)
	select {
	case <-warmed:
	case <-time.After(2 * time.Minute):
		b.Fatalf("the manager did not run one Machine in 2m:\n%s", f.out.String())
	}
}
