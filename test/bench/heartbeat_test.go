package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// Heartbeats as a kubelet sends them: a Lease of 40 s renewed every 10 s.
const (
	heartbeatLease   = 40
	heartbeatRenewal = 10 * time.Second
	// heartbeatWindow is how long the settled fleet is watched.
	heartbeatWindow = 60 * time.Second
	// stoppedLeases is how many machines lose their heartbeat at once.
	stoppedLeases = 10
)

// BenchmarkHeartbeats runs a fleet of N Machines (BENCH_HEARTBEAT_MACHINES,
// 10,000 unless set) whose node agents renew their Leases as kubelets do,
// and measures what the renewals cost the manager at rest: its CPU over a
// minute of a settled fleet, the Machine reconciles, and every write the
// API server took that is not a Lease's. Then it stops the heartbeat of
// ten machines at once (their instances crash: the Node stays Ready, as a
// dead kubelet leaves it) and times how long after each Lease expired its
// Machine said so (NodeHealthy False, NodeLeaseExpired).
func BenchmarkHeartbeats(b *testing.B) {
	for _, n := range sizes(b, "BENCH_HEARTBEAT_MACHINES", 10000) {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			for range b.N {
				heartbeats(b, n)
			}
		})
	}
}

func heartbeats(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var provider *testenv.ServedInmemory
	f := newFleetOf(b, true, func(e *testenv.Env) *testenv.ServedProvider {
		p, err := e.ServeInmemory(testenv.Leases{DurationSeconds: heartbeatLease, RenewInterval: heartbeatRenewal})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Stop() })
		provider = p
		return p.ServedProvider
	})
	ns, ever, running := f.scaleNamespace(ctx, b, n)
	start := time.Now()
	if err := env.Client.Create(ctx, benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{})); err != nil {
		b.Fatal(err)
	}
	select {
	case <-running:
	case <-time.After(2 * timeout(n)):
		b.Fatalf("not every Machine was Running after %s", 2*timeout(n))
	}
	up := time.Since(start)
	exact(ctx, b, ns, n, ever)
	// Settled: every agent has renewed since its Machine came up, and
	// every Machine has looked at its Lease's expiry once since.
	time.Sleep(heartbeatLease*time.Second + 5*time.Second)

	// read is the API server's writes and the manager's metrics now.
	read := func() (testenv.Counts, map[string]float64) {
		w, err := testenv.ReadWrites(ctx, f.kube)
		if err != nil {
			b.Fatal(err)
		}
		m, err := f.scrape()
		if err != nil {
			b.Fatal(err)
		}
		return w, m
	}
	b.ResetTimer()
	before, m0 := read()
	cpu0 := f.cpu(b)
	stopProfile := f.profile(b, fmt.Sprintf("heartbeats-%d", n))
	time.Sleep(heartbeatWindow)
	stopProfile()
	used := f.cpu(b).since(cpu0)
	after, m1 := read()
	b.StopTimer()
	w := after.Done.Since(before.Done)
	leases := w["leases"]
	delete(w, "leases")
	others := 0.0
	for _, v := range w {
		others += v
	}

	late := stopHeartbeats(ctx, b, ns, provider)

	secs := heartbeatWindow.Seconds()
	b.ReportMetric(up.Seconds(), "s-to-running")
	b.ReportMetric(used["manager"].Seconds()/secs, "manager-cores-at-rest")
	b.ReportMetric(used["kube-apiserver"].Seconds()/secs, "kube-apiserver-cores-at-rest")
	b.ReportMetric(used["etcd"].Seconds()/secs, "etcd-cores-at-rest")
	b.ReportMetric(used["provider"].Seconds()/secs, "provider-cores-at-rest")
	b.ReportMetric(leases/secs, "lease-writes/s")
	b.ReportMetric(others, "writes-not-leases")
	b.ReportMetric((m1["controller_runtime_reconcile_total/machine"]-m0["controller_runtime_reconcile_total/machine"])/secs, "machine-reconciles/s")
	b.ReportMetric(slices.Max(late).Seconds(), "stopped-lease-noticed-max-s")
	b.ReportMetric(late[len(late)/2].Seconds(), "stopped-lease-noticed-median-s")
	b.Logf("N=%d: writes at rest other than Leases: %v (refused: %v); stopped Leases noticed after expiry: %v", n, w, after.Refused.Since(before.Refused), late)
}

// stopHeartbeats crashes stoppedLeases machines at once and returns, for
// each, how long after its Lease expired its Machine's NodeHealthy
// condition said NodeLeaseExpired, as a watch saw it; sorted.
func stopHeartbeats(ctx context.Context, b *testing.B, ns string, p *testenv.ServedInmemory) []time.Duration {
	var list machinistv1.MachineList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	if len(list.Items) < stoppedLeases {
		b.Fatalf("%d Machines, fewer than the %d to stop", len(list.Items), stoppedLeases)
	}
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		b.Fatal(err)
	}
	// Spread over the fleet, not the first few created.
	victims := map[string]*machinistv1.Machine{}
	for i := range stoppedLeases {
		m := &list.Items[i*len(list.Items)/stoppedLeases]
		victims[m.Name] = m
	}
	noticed := map[string]time.Time{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		for ev := range events {
			m, ok := ev.Object.(*machinistv1.Machine)
			if !ok || victims[m.Name] == nil {
				continue
			}
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonNodeLeaseExpired {
				continue
			}
			mu.Lock()
			if _, seen := noticed[m.Name]; !seen {
				noticed[m.Name] = time.Now()
			}
			all := len(noticed) == len(victims)
			mu.Unlock()
			if all {
				close(done)
				return
			}
		}
	}()
	for _, m := range victims {
		if err := p.Crash(m.Status.ProviderID); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(3 * heartbeatLease * time.Second):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("after %ds, %d of %d Machines whose heartbeat stopped said so", 3*heartbeatLease, len(noticed), len(victims))
	}
	var late []time.Duration
	for name, m := range victims {
		lease := &coordinationv1.Lease{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: m.Status.NodeRef.Name}, lease); err != nil {
			b.Fatal(err)
		}
		expiry := lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
		late = append(late, noticed[name].Sub(expiry))
	}
	slices.Sort(late)
	return late
}
