package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// flaky is a provider that fails a share of its calls and answers each
// after a random delay. Half of the failures come before the call does
// anything; the other half after it took effect, as a reply lost on the
// way back: the controller cannot tell the two apart, and must not
// repeat what was done.
type flaky struct {
	providers.Actuator
	rate    float64
	latency time.Duration

	mu  sync.Mutex
	rng *rand.Rand

	calls, before, after atomic.Int64
}

func (f *flaky) roll() (delay time.Duration, fail, late bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delay = time.Duration(f.rng.Int64N(int64(f.latency)))
	fail = f.rng.Float64() < f.rate
	return delay, fail, f.rng.IntN(2) == 0
}

func (f *flaky) do(ctx context.Context, call string, fn func() error) error {
	f.calls.Add(1)
	delay, fail, late := f.roll()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if fail && !late {
		f.before.Add(1)
		return fmt.Errorf("%s: injected failure before the call", call)
	}
	err := fn()
	if fail && err == nil {
		f.after.Add(1)
		return fmt.Errorf("%s: injected failure after the call took effect", call)
	}
	return err
}

func (f *flaky) Create(ctx context.Context, m *machinistv1.Machine, c *machinistv1.MachineClass, join providers.Join) (string, error) {
	var id string
	err := f.do(ctx, "create", func() (err error) { id, err = f.Actuator.Create(ctx, m, c, join); return err })
	if err != nil {
		return "", err
	}
	return id, nil
}

func (f *flaky) Exists(ctx context.Context, id string) (bool, error) {
	var ok bool
	err := f.do(ctx, "exists", func() (err error) { ok, err = f.Actuator.Exists(ctx, id); return err })
	return ok, err
}

func (f *flaky) Delete(ctx context.Context, id string) error {
	return f.do(ctx, "delete", func() error { return f.Actuator.Delete(ctx, id) })
}

func (f *flaky) FindByUID(ctx context.Context, uid types.UID) (string, error) {
	var id string
	err := f.do(ctx, "findByUID", func() (err error) { id, err = f.Actuator.FindByUID(ctx, uid); return err })
	if err != nil {
		return "", err
	}
	return id, nil
}

func (f *flaky) Reboot(ctx context.Context, id string, op providers.Operation) error {
	return f.do(ctx, "reboot", func() error { return f.Actuator.Reboot(ctx, id, op) })
}

func (f *flaky) Repair(ctx context.Context, id string, op providers.Operation) error {
	return f.do(ctx, "repair", func() error { return f.Actuator.Repair(ctx, id, op) })
}

func (f *flaky) Update(ctx context.Context, id string, op providers.Operation) error {
	return f.do(ctx, "update", func() error { return f.Actuator.Update(ctx, id, op) })
}

// shortBackoff keeps a Machine that failed a few calls in a row from
// waiting minutes: the faults are meant to be survived, not waited out.
var shortBackoff = machine.Backoff{Base: 500 * time.Millisecond, Cap: 5 * time.Second}

// TestProviderFaults runs a scale-up of 20, a rolling upgrade of them and
// 10 reboots against an inmemory provider that fails 30% of its calls
// (half of them after acting) and answers each after up to 300ms. The
// manager runs in this process, so that the books can be read from the
// provider itself.
func TestProviderFaults(t *testing.T) {
	forEachSeed(t, func(t *testing.T, r *run) {
		provider, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: agentLease, RenewInterval: agentRenew, Seed: r.seed})
		r.must(err)
		f := &flaky{Actuator: provider, rate: 0.3, latency: 300 * time.Millisecond, rng: rand.New(rand.NewPCG(r.seed, 7))}
		r.managerInProcess(env.Config, provider, f, manager.Options{MachineWorkers: 8, MachineSetWorkers: 2, Backoff: shortBackoff})

		r.createDeployment(20, rolling(3, 0), "v1.37.1")
		r.wait("20 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		r.setVersion("v1.37.2")
		r.wait("the rollout", func() error { return r.deploymentSettled("v1.37.2") })
		r.requestAll("reboot", `{"apiVersion":"subresources.machinist.dev/v1alpha1","kind":"RebootOptions"}`)
		r.verify(func(r *run) error { return errors.Join(r.deploymentSettled("v1.37.2"), r.opsSucceeded()) })
		r.note("provider calls: %d, failed before acting %d, failed after acting %d", f.calls.Load(), f.before.Load(), f.after.Load())

	})
}

// managerInProcess runs the manager in this process, reaching
// kube-apiserver with cfg, with act (provider, or provider behind faults)
// as the inmemory provider; the run's books become the provider's and its
// Machines are of that provider. Both stop with the run.
func (r *run) managerInProcess(cfg *rest.Config, provider *inmemory.Provider, act providers.Actuator, opts manager.Options) {
	ctx, cancel := context.WithCancel(context.Background())
	reg := providers.NewRegistry()
	r.must(reg.Register(inmemory.Name, act))
	opts.Actuators, opts.Repeatable, opts.Registry = reg, true, prometheus.NewRegistry()
	mgr, err := manager.New(ctx, cfg, env.Scheme, opts)
	if err != nil {
		cancel()
		r.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	r.holdings = func() (int, int) { return len(instancesOf(provider, r.ns)), 0 }
	r.checkProvider = func() error { return inmemoryBooks(provider, r.ns, r.machineList()) }
	r.restarts = func(_ types.UID, id string) (int, bool) {
		n, err := provider.Restarts(id)
		return n, err == nil
	}
	r.stops = append(r.stops, func() {
		cancel()
		if err := <-done; err != nil {
			r.t.Error(err)
		}
		provider.Stop()
	})
	r.must(env.Client.Patch(context.Background(), &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: class}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"provider":"inmemory"}}`))))
}

// inmemoryBooks checks that each live Machine has its instance, and the
// provider holds no other.
func inmemoryBooks(p *inmemory.Provider, ns string, ms []machinistv1.Machine) error {
	ids := map[string]bool{}
	for _, id := range instancesOf(p, ns) {
		ids[id] = true
	}
	var problems []string
	for _, m := range ms {
		if !ids[m.Status.ProviderID] {
			problems = append(problems, fmt.Sprintf("Machine %s has no instance %q (missing)", m.Name, m.Status.ProviderID))
		}
		delete(ids, m.Status.ProviderID)
	}
	for id := range ids {
		problems = append(problems, fmt.Sprintf("instance %q belongs to no Machine (leaked)", id))
	}
	if len(problems) > 0 {
		return fmt.Errorf("books: %s", strings.Join(problems, "; "))
	}
	return nil
}

// instancesOf lists the provider's instances of namespace ns.
func instancesOf(p *inmemory.Provider, ns string) []string {
	var out []string
	for _, id := range p.Instances() {
		if strings.HasPrefix(id, inmemory.Name+":///"+ns+"/") {
			out = append(out, id)
		}
	}
	return out
}

// TestKillDuringRemediation crashes one Machine's agent under a
// MachineHealthCheck and kills the manager at a random moment while the
// health check notices and heals it.
func TestKillDuringRemediation(t *testing.T) {
	forEachSeed(t, func(t *testing.T, r *run) {
		ctx := context.Background()
		rep := r.startReplica("a")
		r.waitLeader(rep)
		r.createSet(4, nil)
		r.wait("4 Machines Running", func() error { return r.setSettled(4) })
		r.must(env.Client.Create(ctx, healthCheck(r.ns, setName)))
		r.wait("the health check to count 4 healthy Machines", func() error { return r.healthy(4) })

		ms := r.machineList()
		victim := ms[r.rng.IntN(len(ms))]
		r.crashAgent(victim)
		crashed := time.Now()
		// Half the seeds kill first while the health check has still to
		// notice; then every seed kills once the ladder's rung is under way.
		if r.rng.IntN(2) == 0 {
			d := r.between(0, 30*time.Second)
			// On purpose: the kill lands at a random moment.
			time.Sleep(d)
			rep.kill()
			r.note("crashed %s; killed the manager %v later, %s", victim.Name, d.Round(time.Millisecond), r.remediationOf(victim))
		}
		// The rung's write is pushed by the watch at once; a reboot of a
		// process machine is over within a second, too soon for a poll.
		if !r.monitor.awaitVersion(crashed, climbing(victim), 3*time.Minute) {
			t.Fatalf("no rung of the ladder started for %s: %s", victim.Name, r.remediationOf(victim))
		}
		// On purpose: a random moment into the rung.
		time.Sleep(r.between(0, 300*time.Millisecond))
		at := r.remediationOf(victim)
		rep.kill()
		r.note("killed the manager %v after the crash, %s", time.Since(crashed).Round(time.Millisecond), at)
		// Settled, and the crashed Machine back through the ladder:
		// rebooted or repaired (once: checkOnce), or replaced. Until the
		// Node is found Unknown the pool still looks settled.
		r.verify(func(r *run) error { return errors.Join(r.setSettled(4), r.healthy(4), r.healed(victim)) })
		if exits := rep.unplannedExits(); len(exits) > 0 {
			t.Errorf("the manager exited %d times unbidden; last:\n%s", len(exits), exits[len(exits)-1].Tail)
		}
	})
}

// healthCheck heals the Machines labelled pool=pool: a reboot, then a
// repair, then a new Machine.
func healthCheck(ns, pool string) *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "heal"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 5 * time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 5 * time.Second}},
			},
			Remediation: machinistv1.Remediation{
				Ladder: []machinistv1.Rung{
					{Action: machinistv1.RemediateReboot, Mode: machinistv1.RebootHard, Timeout: &metav1.Duration{Duration: 90 * time.Second}},
					{Action: machinistv1.RemediateRepair, Timeout: &metav1.Duration{Duration: 2 * time.Minute}},
					{Action: machinistv1.RemediateReplace},
				},
			},
		},
	}
}

// remediationOf describes where m stands: its phase, remediation and
// operation, as stored now.
func (r *run) remediationOf(m machinistv1.Machine) string {
	got := &machinistv1.Machine{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&m), got); err != nil {
		return err.Error()
	}
	out := "Machine " + string(got.Status.Phase)
	if rem := got.Status.Remediation; rem != nil {
		out += fmt.Sprintf(", remediation %s (rung %d)", rem.Phase, rem.Rung)
	}
	if op := got.Status.Operation; op != nil {
		out += fmt.Sprintf(", operation %s %s", op.ID, op.State)
	}
	return out
}

// healed reports whether the health check brought m back: a reboot or
// repair of its that succeeded, or m replaced (gone).
func (r *run) healed(m machinistv1.Machine) error {
	got := &machinistv1.Machine{}
	err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&m), got)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	op := got.Status.Operation
	if op == nil || op.Source != machinistv1.SourceHealthCheck || op.State != machinistv1.OperationSucceeded {
		return fmt.Errorf("crashed Machine %s not healed yet: operation %+v, remediation %+v", m.Name, op, got.Status.Remediation)
	}
	return nil
}

// healthy reports whether the health check counts n healthy Machines.
func (r *run) healthy(n int32) error {
	h := &machinistv1.MachineHealthCheck{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: r.ns, Name: "heal"}, h); err != nil {
		return err
	}
	if h.Status.HealthyMachines != n || h.Status.ExpectedMachines != n || h.Status.RemediationsInFlight != 0 {
		return fmt.Errorf("health check: %d expected, %d healthy, %d in flight", h.Status.ExpectedMachines, h.Status.HealthyMachines, h.Status.RemediationsInFlight)
	}
	return nil
}
