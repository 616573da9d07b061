package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
)

// created counts, from a watch of ns, every Machine it ever held.
type created struct {
	mu   sync.Mutex
	uids map[types.UID]bool
}

func countCreated(ctx context.Context, b *testing.B, ns string) *created {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		b.Fatal(err)
	}
	c := &created{uids: map[types.UID]bool{}}
	go func() {
		for ev := range events {
			if m, ok := ev.Object.(*machinistv1.Machine); ok && ev.Type != watch.Error {
				c.mu.Lock()
				c.uids[m.UID] = true
				c.mu.Unlock()
			}
		}
	}()
	return c
}

func (c *created) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.uids)
}

// exact checks that every MachineSet of ns holds exactly its replicas and
// that no more Machines than want were ever created, reports the extra
// and missing Machines, and fails the benchmark on any.
func exact(ctx context.Context, b *testing.B, ns string, want int, ever *created) {
	var sets machinistv1.MachineSetList
	var machines machinistv1.MachineList
	if err := env.Client.List(ctx, &sets, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	if err := env.Client.List(ctx, &machines, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	live := map[types.UID]int{}
	for _, m := range machines.Items {
		if ref := metav1.GetControllerOf(&m); ref != nil && m.DeletionTimestamp.IsZero() {
			live[ref.UID]++
		}
	}
	extra, missing := 0, 0
	for _, s := range sets.Items {
		have, replicas := live[s.UID], int(*s.Spec.Replicas)
		extra += max(0, have-replicas)
		missing += max(0, replicas-have)
	}
	surplus := max(0, ever.count()-want)
	b.ReportMetric(float64(extra), "extra-machines")
	b.ReportMetric(float64(missing), "missing-machines")
	b.ReportMetric(float64(surplus), "surplus-created")
	b.Logf("N=%d: %d extra and %d missing Machines at the end; %d Machines created in all", want, extra, missing, ever.count())
	if extra > 0 || missing > 0 || surplus > 0 {
		b.Errorf("the sets do not hold exactly their replicas: %d extra, %d missing, %d created beyond the %d asked for", extra, missing, surplus, want)
	}
}

// BenchmarkScaleUpLostReplies times a MachineDeployment going from 0 to
// 5,000 Machines with the manager behind the fault proxy, once with no
// fault and once with 1% of its Machine creates losing their reply, and
// checks that the sets end with exactly their replicas. The proxy costs
// both the same (TLS, HTTP/2); the difference is the faults'.
func BenchmarkScaleUpLostReplies(b *testing.B) {
	const n = 5000
	for _, c := range []struct {
		name  string
		rules []faults.Rule
	}{
		{"faults=none", nil},
		{"faults=lost-creates-1pct", []faults.Rule{{Name: "lost", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.01}}},
	} {
		b.Run(fmt.Sprintf("machines=%d/%s", n, c.name), func(b *testing.B) {
			for range b.N {
				// Each run (-count too) strikes other requests.
				runs++
				scaleUpThrough(b, n, faults.Config{Seed: runs, Rules: c.rules})
			}
		})
	}
}

// runs counts the runs of BenchmarkScaleUpLostReplies in this process;
// it seeds their faults.
var runs uint64

func scaleUpThrough(b *testing.B, n int, rules faults.Config) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(b, true)
	p, err := faults.Start(f.e.Config, rules, "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	raw, err := p.Kubeconfig()
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "proxy.kubeconfig")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	f.via(path)
	ns, ever, running := f.scaleNamespace(ctx, b, n)
	b.ResetTimer()
	start := time.Now()
	if err := env.Client.Create(ctx, benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{})); err != nil {
		b.Fatal(err)
	}
	select {
	case <-running:
	case <-time.After(timeout(n)):
		b.Fatalf("not every Machine was Running after %s", timeout(n))
	}
	took := time.Since(start)
	b.StopTimer()
	// Long enough for a Machine created twice to have shown.
	// Nothing is to happen now.
	time.Sleep(5 * time.Second)
	f.stop(b)
	b.ReportMetric(took.Seconds(), "s-to-running")
	b.ReportMetric(float64(n)/took.Seconds(), "machines/s")
	b.ReportMetric(float64(p.Struck("lost")), "lost-replies")
	exact(ctx, b, ns, n, ever)
}

// scaleNamespace starts the manager, brings one Machine up so that its
// start is not timed, and returns a namespace with the MachineClass
// "small", a count of the Machines it will ever hold, and a channel closed
// once n of them are Running.
func (f *fleet) scaleNamespace(ctx context.Context, b *testing.B, n int) (string, *created, <-chan struct{}) {
	f.start(b)
	f.warm(ctx, b)
	ns := env.NewNamespace(b, "scale")
	if err := f.e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	ever := countCreated(ctx, b, ns)
	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	return ns, ever, running
}
