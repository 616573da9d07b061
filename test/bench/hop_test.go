package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/dev/testenv"
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
	f := newFleet(b, served)
	f.start(b)
	f.warm(ctx, b)
	ns := env.NewNamespace(b, "hop")
	if err := f.e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	before, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := f.cpu(b)

	b.ResetTimer()
	begin := time.Now()
	createSet(ctx, b, ns, n)
	select {
	case <-running:
	case <-time.After(timeout(n)):
		b.Fatalf("not every Machine was Running after %s", timeout(n))
	}
	took := time.Since(begin)
	used := f.cpu(b).since(cpu0)
	after := finalWrites(ctx, b, f.kube)
	w := after.Done.Since(before.Done)
	b.ReportMetric(took.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/took.Seconds(), "machines/s")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/machine")
	b.ReportMetric(used["manager"].Seconds(), "manager-cpu-s")
	b.ReportMetric(float64(processPeakRSS(b, f.pid()))/(1<<20), "manager-peak-RSS-MiB")
	if served {
		b.ReportMetric(used["provider"].Seconds(), "provider-cpu-s")
		b.ReportMetric(float64(processPeakRSS(b, f.provider.Cmd.Process.Pid))/(1<<20), "provider-peak-RSS-MiB")
	}
}

// processCPU is the user and system CPU time of process pid.
func processCPU(b *testing.B, pid int) time.Duration {
	t, err := pidCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// pidCPU reads the user and system CPU time of process pid from
// /proc/<pid>/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func pidCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, may hold spaces; fields are counted
	// after its closing parenthesis.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("reading /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// processPeakRSS is process pid's peak resident set (VmHWM) in bytes.
func processPeakRSS(b *testing.B, pid int) int64 {
	n, err := vmHWM(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	return n
}
