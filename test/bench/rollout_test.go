package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// BenchmarkRollingUpgrade times a rolling node upgrade of N Machines
// (maxSurge 10%, maxUnavailable 0, zero-latency provider served out of
// process, the manager in a process of its own) from the template change
// until every Machine runs the new version, and in the same run two write
// floors for replacing as many Machines: the Machine writes alone (per
// Machine a create, two status updates, a delete and the finalizer's
// removal), and the full mix the engine's run made (those, plus as many
// Events, Node and Lease writes and set writes), made directly with the
// engine's parallelism. Its "budget" run does the same under a
// MachineDisruptionBudget of 10% over the pool (as many as the surge), so
// that every deletion of an old Machine asks it: the difference is what a
// budget costs a rollout.
func BenchmarkRollingUpgrade(b *testing.B) {
	for _, c := range []struct {
		n      int
		budget bool
	}{{500, false}, {2000, false}, {500, true}} {
		name := fmt.Sprintf("machines=%d/no-budget", c.n)
		if c.budget {
			name = fmt.Sprintf("machines=%d/budget", c.n)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				rollingUpgrade(b, c.n, c.budget)
			}
		})
	}
}

func rollingUpgrade(b *testing.B, n int, budget bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(b, true)
	f.start(b)
	ns := env.NewNamespace(b, "rollout")
	if err := f.e.InmemoryClass(ctx, ns, "small", ""); err != nil {
		b.Fatal(err)
	}
	surge, unavailable := intstr.FromString("10%"), intstr.FromInt32(0)
	md := benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable}})
	before, err := watchVersion(ctx, ns, n, "v1.37.1")
	if err != nil {
		b.Fatal(err)
	}
	if err := env.Client.Create(ctx, md); err != nil {
		b.Fatal(err)
	}
	wait(b, before, timeout(n), "the first version")
	if budget {
		mdb := &machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{
				Selector:     md.Spec.Selector,
				MaxDisrupted: intstr.FromString("10%"),
			},
		}
		if err := env.Client.Create(ctx, mdb); err != nil {
			b.Fatal(err)
		}
	}

	upgraded, err := watchVersion(ctx, ns, n, "v1.37.2")
	if err != nil {
		b.Fatal(err)
	}
	w0, err := testenv.ReadWrites(ctx, f.kube)
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := f.cpu(b)
	profiled := f.profile(b, fmt.Sprintf("rollout-%d", n))
	b.ResetTimer()
	start := time.Now()
	patch := []byte(`{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`)
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, patch)); err != nil {
		b.Fatal(err)
	}
	wait(b, upgraded, 2*timeout(n), "the upgrade")
	engine := time.Since(start)
	used := f.cpu(b).since(cpu0)
	profiled()
	w1 := finalWrites(ctx, b, f.kube)
	f.stop(b)
	w := w1.Done.Since(w0.Done)
	refused := w1.Refused.Since(w0.Refused)
	floor, _ := replaceFloor(ctx, b, n, nil)
	mix, replayed := replaceFloor(ctx, b, n, w)
	object := w.Sum("machines", "machines/status", "machinesets", "machinesets/status", "machinedeployments", "machinedeployments/status", "nodes")
	b.ReportMetric(engine.Seconds(), "s-to-upgraded")
	b.ReportMetric(object/float64(n), "writes/replaced-machine")
	b.ReportMetric(refused.Sum(keys(refused)...)/float64(n), "refused-writes/replaced-machine")
	b.ReportMetric(w.Sum("events")/float64(n), "events/replaced-machine")
	b.ReportMetric(floor.Seconds(), "floor-s")
	b.ReportMetric(engine.Seconds()/floor.Seconds(), "engine/floor")
	b.ReportMetric(mix.Seconds(), "mix-floor-s")
	b.ReportMetric(engine.Seconds()/mix.Seconds(), "engine/mix-floor")
	used.report(b)
	lists := w1.Lists.Since(w0.Lists)
	if budget {
		b.ReportMetric(w.Sum("machinedisruptionbudgets/status")/float64(n), "budget-writes/replaced-machine")
		b.ReportMetric(lists.Sum("machinedisruptionbudgets")/float64(n), "budget-lists/replaced-machine")
	}
	b.Logf("N=%d: successful writes by resource %v; refused %v; lists %v; full-mix floor replayed %v", n, w, refused, lists, replayed)
}

// benchDeployment is the MachineDeployment of n Machines at v1.37.1 the
// upgrade benchmarks roll out.
func benchDeployment(ns string, n int, strategy machinistv1.MachineDeploymentStrategy) *machinistv1.MachineDeployment {
	labels := map[string]string{"pool": "bench"}
	return &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(n)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Strategy: strategy,
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.1"},
			},
		},
	}
}

// watchVersion closes the returned channel once exactly n Machines exist
// in ns, all Running at version.
func watchVersion(ctx context.Context, ns string, n int, version string) (<-chan struct{}, error) {
	done, _, err := watchUntil(ctx, ns, n, func(m *machinistv1.Machine) bool {
		return m.Spec.Version == version && m.Status.Phase == machinistv1.MachineRunning && m.DeletionTimestamp.IsZero()
	})
	return done, err
}

// watchUntil closes the returned channel once exactly n Machines exist in
// ns and ok holds for each; churn reports how many Machines were added or
// deleted since it began. The watch streams changes only, so it starts
// from a list of what is there.
func watchUntil(ctx context.Context, ns string, n int, ok func(*machinistv1.Machine) bool) (done <-chan struct{}, churn func() int, err error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, nil, err
	}
	var list machinistv1.MachineList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, nil, err
	}
	all := map[string]*machinistv1.Machine{}
	seen := map[types.UID]bool{}
	for i := range list.Items {
		all[list.Items[i].Name] = &list.Items[i]
		seen[list.Items[i].UID] = true
	}
	closed := make(chan struct{})
	var mu sync.Mutex
	changes := 0
	check := func() bool {
		if len(all) != n {
			return false
		}
		for _, m := range all {
			if !ok(m) {
				return false
			}
		}
		return true
	}
	go func() {
		if check() {
			close(closed)
			return
		}
		for ev := range events {
			m, isMachine := ev.Object.(*machinistv1.Machine)
			if !isMachine {
				continue
			}
			mu.Lock()
			switch {
			case ev.Type == watch.Deleted:
				delete(all, m.Name)
				changes++
			case !seen[m.UID]:
				seen[m.UID] = true
				changes++
				all[m.Name] = m
			default:
				all[m.Name] = m
			}
			mu.Unlock()
			if check() {
				close(closed)
				return
			}
		}
	}()
	return closed, func() int { mu.Lock(); defer mu.Unlock(); return changes }, nil
}

func wait(b *testing.B, done <-chan struct{}, d time.Duration, what string) {
	select {
	case <-done:
	case <-time.After(d):
		b.Fatalf("%s did not finish in %s", what, d)
	}
}

// replaceFloor replaces n Machines directly: for each, a create, two
// status updates, the old one's delete and the removal of its finalizer;
// with engine's writes, it is the full-mix floor of that run (mixFloor).
// The old Machines are made before the clock starts.
func replaceFloor(ctx context.Context, b *testing.B, n int, engine testenv.Writes) (time.Duration, testenv.Writes) {
	c := floorClient(b)
	newMachine := func(ns, prefix string) *machinistv1.Machine {
		return &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: prefix, Finalizers: []string{machinistv1.MachineFinalizer}},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
		}
	}
	var old []*machinistv1.Machine
	prepare := func(ctx context.Context, c client.Client, ns string) error {
		old = make([]*machinistv1.Machine, n)
		for i := range old {
			old[i] = newMachine(ns, "old-")
			if err := c.Create(ctx, old[i]); err != nil {
				return err
			}
		}
		return nil
	}
	work := func(ctx context.Context, c client.Client, ns string, i int) error {
		return replaceOne(ctx, c, newMachine(ns, "new-"), old[i], i)
	}
	if engine == nil {
		ns := env.NewNamespace(b, "floor")
		if err := prepare(ctx, c, ns); err != nil {
			b.Fatal(err)
		}
		return runUnits(ctx, b, c, ns, n, work), nil
	}
	return mixFloor(ctx, b, n, prepare, work, testenv.Writes{"machines": 3 * float64(n), "machines/status": 2 * float64(n)}, engine)
}

func replaceOne(ctx context.Context, c client.Client, m, old *machinistv1.Machine, i int) error {
	if err := c.Create(ctx, m); err != nil {
		return err
	}
	for _, p := range []machinistv1.MachinePhase{machinistv1.MachineProvisioning, machinistv1.MachineRunning} {
		m.Status.Phase, m.Status.ProviderID = p, "floor:///"+strconv.Itoa(i)
		if err := c.Status().Update(ctx, m); err != nil {
			return err
		}
	}
	if err := c.Delete(ctx, old); err != nil {
		return err
	}
	return c.Patch(ctx, old, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
}
