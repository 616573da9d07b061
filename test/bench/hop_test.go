package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/internal/testenv"
)

// BenchmarkProviderHop scales a MachineSet from 0 to 1,000 Running
// Machines twice in one run: with the inmemory provider inside `machinist
// manager`, and with it served by `machinist provider serve`, reached over
// a Unix socket. The difference is the cost of the hop. Each runs as a
// process of its own, started afresh for each measurement, so that the
// manager's CPU and peak RSS are its own, and the provider's (its 1,000
// node agents) are measured apart.
func BenchmarkProviderHop(b *testing.B) {
	const n = 1000
	for _, mode := range []string{"in-process", "socket"} {
		b.Run("provider="+mode, func(b *testing.B) {
			for range b.N {
				hop(b, n, mode == "socket")
			}
		})
	}
}

func hop(b *testing.B, n int, served bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := freshEnv(b, testenv.Options{})
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		b.Fatal(err)
	}
	bin, err := testenv.Machinist()
	if err != nil {
		b.Fatal(err)
	}
	args := []string{"manager", "--kubeconfig", e.Kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--machine-workers", strconv.Itoa(workers), "--set-workers=4",
		"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(burst), "--log-level=error"}
	// As setUp: Leases renewed rarely, so that heartbeats do not blur
	// the figures.
	var sp *testenv.ServedProvider
	if served {
		if sp, err = e.ServeProvider("inmemory", "--lease-duration-seconds=3600", "--renew-interval=1h", "--log-level=error"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sp.Stop() })
		args = append(args, "--provider=inmemory="+sp.Endpoint)
	} else {
		args = append(args, "--inmemory-lease-duration-seconds=3600", "--inmemory-renew-interval=1h")
	}
	mgr := exec.Command(bin, args...)
	var out bytes.Buffer
	mgr.Stdout, mgr.Stderr = &out, &out
	if err := mgr.Start(); err != nil {
		b.Fatal(err)
	}
	if err := orphans.Guard(mgr.Process.Pid); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mgr.Process.Signal(syscall.SIGTERM); _ = mgr.Wait() })

	// One Machine first, so that the manager's start (cache sync, the
	// first connection to the provider) is not timed.
	warm := namespace(ctx, b, "warm")
	if err := e.InmemoryClass(ctx, warm, "small", ""); err != nil {
		b.Fatal(err)
	}
	warmed, err := watchRunning(ctx, warm, 1)
	if err != nil {
		b.Fatal(err)
	}
	createSet(ctx, b, warm, 1)
	select {
	case <-warmed:
	case <-time.After(2 * time.Minute):
		b.Fatalf("the manager did not run one Machine in 2m:\n%s", out.String())
	}

	ns := namespace(ctx, b, "hop")
	if err := e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}
	managerBefore := processCPU(b, mgr.Process.Pid)
	var providerBefore time.Duration
	if served {
		providerBefore = processCPU(b, sp.Cmd.Process.Pid)
	}

	b.ResetTimer()
	begin := time.Now()
	createSet(ctx, b, ns, n)
	select {
	case <-running:
	case <-time.After(timeout(n)):
		b.Fatalf("not every Machine was Running after %s", timeout(n))
	}
	took := time.Since(begin)
	managerCPU := processCPU(b, mgr.Process.Pid) - managerBefore
	var providerCPU time.Duration
	if served {
		providerCPU = processCPU(b, sp.Cmd.Process.Pid) - providerBefore
	}
	after := finalWrites(ctx, b, kube)
	w := after.Done.Since(before.Done)
	b.ReportMetric(took.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/took.Seconds(), "machines/s")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/machine")
	b.ReportMetric(managerCPU.Seconds(), "manager-cpu-s")
	b.ReportMetric(float64(processPeakRSS(b, mgr.Process.Pid))/(1<<20), "manager-peak-RSS-MiB")
	if served {
		b.ReportMetric(providerCPU.Seconds(), "provider-cpu-s")
		b.ReportMetric(float64(processPeakRSS(b, sp.Cmd.Process.Pid))/(1<<20), "provider-peak-RSS-MiB")
	}
}

// processCPU is the user and system CPU time of process pid, from
// /proc/<pid>/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func processCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name, field 2, may hold spaces; fields are counted
	// after its closing parenthesis.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("reading /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// processPeakRSS is process pid's peak resident set (VmHWM) in bytes.
func processPeakRSS(b *testing.B, pid int) int64 {
	n, err := vmHWM(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	return n
}
