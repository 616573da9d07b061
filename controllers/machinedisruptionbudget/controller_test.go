package machinedisruptionbudget_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinedisruptionbudget"
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

// TestTheControllerKeepsTheStatusAndEndsDisruptions runs the budget
// controller alone, with a clock the test moves: the counts follow the
// Machines, an admitted disruption ends when its operation ends, one that
// never showed lapses, a closed window shows its next opening, and a
// settled budget is not written again.
func TestTheControllerKeepsTheStatusAndEndsDisruptions(t *testing.T) {
	ns := env.NewNamespace(t, "disruption")
	ms := env.ReadyMachines(t, ns, "a", 4)
	env.NewBudget(t, ns, "b", map[string]string{"pool": "a"}, intstr.FromInt32(2))
	var mu sync.Mutex
	// Whole seconds, as the API stores times.
	clock := time.Now().Truncate(time.Second)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	skip := true
	// Writes as often as asked: the test reconciles by hand and reads what
	// each reconcile wrote.
	r := &machinedisruptionbudget.Reconciler{Client: mgr.GetClient(), Now: now, StatusInterval: -1}
	if err := r.SetupWithManager(mgr, controller.Options{SkipNameValidation: &skip}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	status := func() machinistv1.MachineDisruptionBudgetStatus {
		var b machinistv1.MachineDisruptionBudget
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, &b); err != nil {
			t.Fatal(err)
		}
		return b.Status
	}
	waitFor := func(what string, cond func(machinistv1.MachineDisruptionBudgetStatus) bool) {
		t.Helper()
		testenv.WaitFor(t, 20*time.Second, what, func() error {
			if s := status(); !cond(s) {
				return fmt.Errorf("status %+v", s)
			}
			return nil
		})
	}
	waitFor("counts of a fleet at rest", func(s machinistv1.MachineDisruptionBudgetStatus) bool {
		return s.SelectedMachines == 4 && s.MaxDisrupted == 2 && s.DisruptionsAllowed == 2 && s.WindowOpen
	})

	// Two admitted: one whose reboot starts and ends, one that never shows.
	if err := disruption.Direct(env.Client).Admit(ctx, reboot(ms[0], "op0"), now()); err != nil {
		t.Fatal(err)
	}
	if err := disruption.Direct(env.Client).Admit(ctx, reboot(ms[1], "op1"), now()); err != nil {
		t.Fatal(err)
	}
	waitFor("two admitted", func(s machinistv1.MachineDisruptionBudgetStatus) bool {
		return s.Disrupted == 2 && s.DisruptionsAllowed == 0
	})
	m := ms[0].DeepCopy()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	m.Status.Operation = &machinistv1.Operation{ID: "op0", Type: machinistv1.OperationReboot, State: machinistv1.OperationSucceeded}
	if err := env.Client.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitFor("the finished reboot's disruption ended", func(s machinistv1.MachineDisruptionBudgetStatus) bool {
		return s.Disrupted == 1 && len(s.Disruptions) == 1 && s.Disruptions[0].Machine == ms[1].Name
	})
	// Nothing will change on the Machines: the controller must ask to
	// come back when the record lapses, Pending after it was admitted
	// (the clock has not moved since).
	key := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: "b"}}
	// The manager's own reconcile of the budget may write first: a
	// conflict asks to look again, as it would in the manager.
	reconcileNow := func() ctrl.Result {
		t.Helper()
		var res ctrl.Result
		testenv.WaitFor(t, 5*time.Second, "a reconcile of the budget without a conflict", func() bool {
			var err error
			if res, err = r.Reconcile(ctx, key); err != nil {
				t.Fatal(err)
			}
			return !res.Requeue
		})
		return res
	}
	res := reconcileNow()
	if res.RequeueAfter != disruption.Pending+time.Second {
		t.Errorf("RequeueAfter = %s, want %s: when the record lapses", res.RequeueAfter, disruption.Pending+time.Second)
	}
	mu.Lock()
	clock = clock.Add(disruption.Pending + time.Second)
	mu.Unlock()
	// That time has come (on the test's clock): the look it asked for.
	reconcileNow()
	waitFor("the disruption that never showed lapsed", func(s machinistv1.MachineDisruptionBudgetStatus) bool {
		return s.Disrupted == 0 && len(s.Disruptions) == 0 && s.DisruptionsAllowed == 2
	})

	// A closed window.
	var b machinistv1.MachineDisruptionBudget
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &b); err != nil {
		t.Fatal(err)
	}
	closed := clock.UTC().Add(2 * time.Hour)
	b.Spec.Windows = []machinistv1.DisruptionWindow{{Schedule: fmt.Sprintf("%d %d * * *", closed.Minute(), closed.Hour()), Duration: metav1.Duration{Duration: time.Hour}}}
	if err := env.Client.Update(ctx, &b); err != nil {
		t.Fatal(err)
	}
	waitFor("the window closed, its next opening shown", func(s machinistv1.MachineDisruptionBudgetStatus) bool {
		return !s.WindowOpen && s.DisruptionsAllowed == 0 && s.NextWindow != nil && s.NextWindow.Time.Equal(closed.Truncate(time.Minute))
	})

	// At rest: no write.
	rv := func() string {
		var b machinistv1.MachineDisruptionBudget
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &b); err != nil {
			t.Fatal(err)
		}
		return b.ResourceVersion
	}
	before := rv()
	// Nothing is to happen now: three seconds in which a write would show.
	time.Sleep(3 * time.Second)
	if after := rv(); after != before {
		t.Errorf("a settled budget was written: resourceVersion %s -> %s", before, after)
	}
	// And it asks to come back when the window opens.
	res = reconcileNow()
	if want := closed.Truncate(time.Minute).Sub(now()) + time.Second; res.RequeueAfter != want {
		t.Errorf("RequeueAfter = %s, want %s: when the window opens", res.RequeueAfter, want)
	}
}
