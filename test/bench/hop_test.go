package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/internal/manager"
	"github.com/machinist-dev/machinist/internal/testenv"
)

// BenchmarkProviderHop scales a MachineSet from 0 to 1,000 Running
// Machines twice in one run: with the inmemory provider in the manager's
// process, and with it served by `machinist provider serve` in a process
// of its own, reached over a Unix socket. The difference is the cost of
// the hop. With the provider out of process, this process's CPU and peak
// RSS are the manager's own (and the benchmark's watch); the provider's
// are measured in its process.
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
	// As setUp: Leases renewed rarely, so that heartbeats do not blur
	// the figures.
	leases := testenv.Leases{DurationSeconds: 3600, RenewInterval: time.Hour}
	opts := manager.Options{MachineWorkers: workers, MachineSetWorkers: 4, QPS: qps, Burst: burst}
	// A run before this one left its heap mapped; handed back, it does
	// not count in this run's peak.
	debug.FreeOSMemory()
	resetPeakRSS()
	start := e.StartControllers
	if served {
		start = e.StartServedControllers
	}
	ctrls, err := start(opts, leases)
	if err != nil {
		b.Fatal(err)
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
	cpuBefore := ownCPU()
	var providerBefore time.Duration
	if served {
		providerBefore = processCPU(b, ctrls.Served.Cmd.Process.Pid)
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
	managerCPU := ownCPU() - cpuBefore
	after := finalWrites(ctx, b, kube)
	w := after.Done.Since(before.Done)
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	b.ReportMetric(took.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/took.Seconds(), "machines/s")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/machine")
	b.ReportMetric(managerCPU.Seconds(), "manager-cpu-s")
	b.ReportMetric(float64(peakRSS())/(1<<20), "manager-peak-RSS-MiB")
	b.ReportMetric(float64(mem.HeapInuse)/(1<<20), "manager-heap-MiB")
	if served {
		pid := ctrls.Served.Cmd.Process.Pid
		b.ReportMetric((processCPU(b, pid) - providerBefore).Seconds(), "provider-cpu-s")
		b.ReportMetric(float64(processPeakRSS(b, pid))/(1<<20), "provider-peak-RSS-MiB")
	}
	if err := ctrls.Stop(); err != nil {
		b.Fatal(err)
	}
}

// ownCPU is the user and system CPU time this process has used.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
