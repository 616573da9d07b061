package disruption_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

func reboot(m *machinistv1.Machine, op string) disruption.Request {
	return disruption.Request{Machine: m, Reason: machinistv1.DisruptionReboot, OperationID: op, By: "test"}
}

func TestConcurrentRequestsNeverTakeMoreThanTheBudget(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 10)
	env.NewBudget(t, ns, "two", map[string]string{"pool": "a"}, intstr.FromInt32(2))
	// Ten actors at once, each with a client of its own, as the verbs
	// server's replicas and the controllers would be.
	var wg sync.WaitGroup
	results := make([]error, len(ms))
	for i, m := range ms {
		wg.Go(func() {
			c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
			if err != nil {
				results[i] = err
				return
			}
			results[i] = disruption.Direct(c).Admit(context.Background(), reboot(m, fmt.Sprintf("op-%d", i)), time.Now())
		})
	}
	wg.Wait()
	admitted := 0
	for i, err := range results {
		switch r, refused := disruption.AsRefusal(err); {
		case err == nil:
			admitted++
		case refused:
			if r.Budget != "two" || r.RetryAfter <= 0 {
				t.Errorf("Machine %d: refusal %+v", i, r)
			}
		default:
			t.Errorf("Machine %d: %v", i, err)
		}
	}
	if admitted != 2 {
		t.Errorf("%d admitted, want 2", admitted)
	}
	var b machinistv1.MachineDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "two"}, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Status.Disruptions) != 2 || b.Status.Disrupted != 2 || b.Status.DisruptionsAllowed != 0 {
		t.Errorf("budget status: %d recorded, disrupted %d, allowed %d; want 2, 2, 0", len(b.Status.Disruptions), b.Status.Disrupted, b.Status.DisruptionsAllowed)
	}
	// Asking again for an admitted Machine is no second disruption.
	for i, err := range results {
		if err == nil {
			if err := disruption.Direct(env.Client).Admit(context.Background(), reboot(ms[i], fmt.Sprintf("op-%d", i)), time.Now()); err != nil {
				t.Errorf("asking again for admitted Machine %d: %v", i, err)
			}
		}
	}
}

func TestTheStricterBudgetWinsAndReasonsArePassedBy(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 4)
	env.NewBudget(t, ns, "loose", map[string]string{"pool": "a"}, intstr.FromInt32(3))
	env.NewBudget(t, ns, "strict", map[string]string{"pool": "a"}, intstr.FromInt32(1)) // v1beta1 refuses an empty selector
	env.NewBudget(t, ns, "rollouts-only", map[string]string{"pool": "a"}, intstr.FromInt32(0), func(b *machinistv1.MachineDisruptionBudget) {
		b.Spec.Reasons = []machinistv1.DisruptionReason{machinistv1.DisruptionRollout}
	})
	ctx := context.Background()
	if err := disruption.Direct(env.Client).Admit(ctx, reboot(ms[0], "a"), time.Now()); err != nil {
		t.Fatalf("first reboot: %v (a budget for rollouts only must not slow reboots)", err)
	}
	err := disruption.Direct(env.Client).Admit(ctx, reboot(ms[1], "b"), time.Now())
	if r, ok := disruption.AsRefusal(err); !ok || r.Budget != "strict" {
		t.Fatalf("second reboot: %v, want a refusal by budget strict", err)
	}
	rollout := disruption.Request{Machine: ms[2], Reason: machinistv1.DisruptionRollout, By: "machinedeployment/d"}
	if r, ok := disruption.AsRefusal(disruption.Direct(env.Client).Admit(ctx, rollout, time.Now())); !ok || r.Budget != "strict" && r.Budget != "rollouts-only" {
		t.Fatalf("a rollout: want a refusal, got %v", r)
	}
}

func TestAClosedWindowRefusesUntilItOpens(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 3)
	env.NewBudget(t, ns, "nightly", map[string]string{"pool": "a"}, intstr.FromInt32(1), func(b *machinistv1.MachineDisruptionBudget) {
		b.Spec.Windows = []machinistv1.DisruptionWindow{{Schedule: "0 2 * * *", Duration: metav1.Duration{Duration: time.Hour}}}
	})
	noon := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	err := disruption.Direct(env.Client).Admit(context.Background(), reboot(ms[0], "x"), noon)
	r, ok := disruption.AsRefusal(err)
	if !ok || r.RetryAfter != 14*time.Hour {
		t.Fatalf("at noon: %v, want a refusal retrying after 14h (02:00)", err)
	}
	if err := disruption.Direct(env.Client).Admit(context.Background(), reboot(ms[0], "x"), noon.Add(14*time.Hour+time.Minute)); err != nil {
		t.Fatalf("at 02:01: %v", err)
	}
}

func TestADeadMachineIsNotADisruption(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 3)
	env.NewBudget(t, ns, "none", map[string]string{"pool": "a"}, intstr.FromInt32(0))
	ctx := context.Background()
	if _, ok := disruption.AsRefusal(disruption.Direct(env.Client).Admit(ctx, reboot(ms[0], "x"), time.Now())); !ok {
		t.Fatal("a budget of 0 admitted a reboot")
	}
	dead := ms[1].DeepCopy()
	dead.Status.Conditions[0].Status = metav1.ConditionFalse
	dead.Status.Conditions[0].Reason = "NodeLeaseExpired"
	if err := env.Client.Status().Update(ctx, dead); err != nil {
		t.Fatal(err)
	}
	req := disruption.Request{Machine: dead, Reason: machinistv1.DisruptionRemediation, OperationID: "heal", By: "machinehealthcheck/h"}
	if err := disruption.Direct(env.Client).Admit(ctx, req, time.Now()); err != nil {
		t.Fatalf("the remediation of a dead Machine: %v", err)
	}
}

// countingReader passes reads to a client and counts the lists of budgets.
type countingReader struct {
	client.Reader
	lists int
}

func (c *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*machinistv1.MachineDisruptionBudgetList); ok {
		c.lists++
	}
	return c.Reader.List(ctx, list, opts...)
}

// A Store with a cache reads past it only when the cache holds a budget
// that applies: a disruption no budget covers costs no read of the API
// server, and one a budget covers is decided on the API server's copy.
func TestACacheSparesTheReadWhenNoBudgetApplies(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 2)
	ctx := context.Background()
	api := &countingReader{Reader: env.Client}
	store := disruption.Store{Budgets: api, Machines: env.Client, Status: env.Client, Cache: env.Client}
	if err := store.Admit(ctx, reboot(ms[0], "x"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if api.lists != 0 {
		t.Fatalf("%d lists past the cache with no budget in it, want 0", api.lists)
	}
	env.NewBudget(t, ns, "none", map[string]string{"pool": "a"}, intstr.FromInt32(0))
	if _, ok := disruption.AsRefusal(store.Admit(ctx, reboot(ms[1], "y"), time.Now())); !ok {
		t.Fatal("a budget of 0 in the cache admitted a reboot")
	}
	if api.lists != 1 {
		t.Fatalf("%d lists past the cache with a budget in it, want 1", api.lists)
	}
	// A budget that the cache does not hold yet (here: a cache that never
	// will) holds nothing back.
	blind := disruption.Store{Budgets: api, Machines: env.Client, Status: env.Client, Cache: emptyBudgets{env.Client}}
	if err := blind.Admit(ctx, reboot(ms[1], "z"), time.Now()); err != nil {
		t.Fatalf("with no budget in the cache: %v", err)
	}
}

// emptyBudgets is a cache that has not seen any budget yet.
type emptyBudgets struct{ client.Reader }

func (e emptyBudgets) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*machinistv1.MachineDisruptionBudgetList); ok {
		return nil
	}
	return e.Reader.List(ctx, list, opts...)
}

// Fifty reboots asked at once in one process under one budget are all
// admitted and recorded: the askers take turns rather than lose the
// budget's write to each other.
func TestManyAtOnceAreAllAdmitted(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 50)
	env.NewBudget(t, ns, "all", map[string]string{"pool": "a"}, intstr.FromString("100%"))
	ctx := context.Background()
	errs := make(chan error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			errs <- disruption.Direct(env.Client).Admit(ctx, reboot(m, fmt.Sprintf("op%d", i)), time.Now())
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var b machinistv1.MachineDisruptionBudget
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "all"}, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Status.Disruptions) != len(ms) {
		t.Fatalf("%d disruptions recorded, want %d", len(b.Status.Disruptions), len(ms))
	}
}

// conflicting writes nothing and answers every write with a conflict, as
// if another process always wrote the budget first.
type conflicting struct{ client.StatusClient }

func (conflicting) Status() client.SubResourceWriter { return conflictingWriter{} }

type conflictingWriter struct{ client.SubResourceWriter }

func (conflictingWriter) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	return apierrors.NewConflict(machinistv1.GroupVersion.WithResource("machinedisruptionbudgets").GroupResource(), "all", errors.New("written by another"))
}

// A request that loses every write to other writers is refused, briefly,
// not failed: the verbs answer 429, not 500.
func TestContentionIsARefusal(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 1)
	env.NewBudget(t, ns, "all", map[string]string{"pool": "a"}, intstr.FromString("100%"))
	store := disruption.Store{Budgets: env.Client, Machines: env.Client, Status: conflicting{}}
	r, ok := disruption.AsRefusal(store.Admit(context.Background(), reboot(ms[0], "x"), time.Now()))
	if !ok || r.RetryAfter != time.Second || r.Budget != "" || !strings.Contains(r.Message, "are busy") {
		t.Fatalf("got %+v, want a refusal for 1s saying the budgets are busy", r)
	}
}

// An actor admitted and then unable to carry the disruption out (the verbs
// server whose write of the operation failed) gives the allowance back at
// once, rather than holding it until the record lapses.
func TestReleaseGivesTheAllowanceBack(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 2)
	env.NewBudget(t, ns, "one", map[string]string{"pool": "a"}, intstr.FromInt32(1))
	ctx := context.Background()
	store := disruption.Direct(env.Client)
	if err := store.Admit(ctx, reboot(ms[0], "x"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, ok := disruption.AsRefusal(store.Admit(ctx, reboot(ms[1], "y"), time.Now())); !ok {
		t.Fatal("a budget of 1 admitted a second reboot")
	}
	if err := store.Release(ctx, reboot(ms[0], "x")); err != nil {
		t.Fatal(err)
	}
	if err := store.Admit(ctx, reboot(ms[1], "y"), time.Now()); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
