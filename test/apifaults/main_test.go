// Package apifaults holds Machinist to its counts when kube-apiserver's
// replies are lost, come late or are refused: a MachineSet creates and
// deletes exactly the Machines it needs, its status ends true, a drain
// finishes without an error, and a disruption budget neither counts a
// disruption twice nor keeps a slot for one that never came. Each test
// runs the controllers through a fault-injecting proxy (package faults)
// whose Machine watches lag, so that the cache is behind the writes as it
// is at scale; the provider's machines reach kube-apiserver directly.
package apifaults

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env   *testenv.Env
	proxy *faults.Proxy
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		env = e
		var err error
		proxy, err = faults.Start(e.Config, faults.Config{}, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		return func() { _ = proxy.Close() }, nil
	}))
}

// watchLag is how far behind kube-apiserver the manager's Machine watch
// runs: wide enough that a reconcile retrying a failed write acts on a
// cache that does not show the write yet.
const watchLag = 300 * time.Millisecond

// laggingMachines is the rule that makes the manager's cache of Machines
// lag.
var laggingMachines = faults.Rule{Name: "lagging-machines", Fault: faults.Latency, Verbs: []string{"watch"},
	Resources: []string{"machines"}, Rate: 1, Delay: metav1.Duration{Duration: watchLag}}

// start arms the proxy with rules (and a lagging Machine watch), then
// starts the controllers through it; both end with the test.
func start(t *testing.T, seed uint64, rules ...faults.Rule) *testenv.Controllers {
	t.Helper()
	arm(t, seed, rules...)
	c, err := env.StartControllersVia(proxy.Config(), manager.Options{DrainPoll: 200 * time.Millisecond},
		testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = proxy.Settle(ctx)
		_ = proxy.Reset(faults.Config{})
	})
	return c
}

// arm replaces the proxy's rules with rules and a lagging Machine watch,
// and starts its counts again. Watches already open keep their fate.
func arm(t *testing.T, seed uint64, rules ...faults.Rule) {
	t.Helper()
	if err := proxy.Reset(faults.Config{Seed: seed, Rules: append([]faults.Rule{laggingMachines}, rules...)}); err != nil {
		t.Fatal(err)
	}
}

func scale(t *testing.T, ms *machinistv1.MachineSet, replicas int32) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)))
	if err := env.Client.Patch(context.Background(), ms, patch); err != nil {
		t.Fatal(err)
	}
}

// tally records, from a watch that does not pass the proxy, every Machine
// the namespace ever had and which of them were ever marked for deletion.
type tally struct {
	mu       sync.Mutex
	created  map[types.UID]string
	deleting map[types.UID]string
}

// deployment is the MachineDeployment pool of ns, of the class small, at
// version.
func deployment(ns string, replicas int32, strategy machinistv1.MachineDeploymentStrategy, version string) *machinistv1.MachineDeployment {
	md := testenv.MachineDeployment(ns, "pool", replicas)
	md.Spec.Strategy = strategy
	md.Spec.Template.Spec.Version = version
	return md
}

// emptySet creates a namespace, a watch counting its Machines, and in it
// the MachineSet pool of no replicas.
func emptySet(t *testing.T) (string, *machinistv1.MachineSet, *tally) {
	t.Helper()
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	seen := watchMachines(t, ns)
	ms := testenv.MachineSet(ns, "pool", 0)
	if err := env.Client.Create(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
	return ns, ms, seen
}

func watchMachines(t *testing.T, ns string) *tally {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := &tally{created: map[types.UID]string{}, deleting: map[types.UID]string{}}
	go func() {
		for e := range events {
			m, ok := e.Object.(*machinistv1.Machine)
			if !ok || e.Type == watch.Error {
				continue
			}
			w.mu.Lock()
			w.created[m.UID] = m.Name
			if !m.DeletionTimestamp.IsZero() || e.Type == watch.Deleted {
				w.deleting[m.UID] = m.Name
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *tally) counts() (created, deleting int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.created), len(w.deleting)
}

// live lists the namespace's Machines not being deleted.
func live(t *testing.T, ns string) []machinistv1.Machine {
	t.Helper()
	var out []machinistv1.Machine
	for _, m := range env.Machines(t, ns) {
		if m.DeletionTimestamp.IsZero() {
			out = append(out, m)
		}
	}
	return out
}

// settled waits until ns holds exactly n Machines, none deleting, all
// Running and Ready.
func settled(t *testing.T, ns string, n int, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, "the set to settle", func() bool {
		var list machinistv1.MachineList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false
		}
		if len(list.Items) != n {
			return false
		}
		for _, m := range list.Items {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
			if !m.DeletionTimestamp.IsZero() || m.Status.Phase != machinistv1.MachineRunning || c == nil || c.Status != metav1.ConditionTrue {
				return false
			}
		}
		return true
	})
}
