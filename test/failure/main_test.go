// Package failure tests what Machinist does when things go wrong: a
// provider that keeps failing, a class that is missing, a status write
// that is refused, a fleet at rest. Every test runs against a real etcd and
// kube-apiserver, with the controllers' default backoff (1 s doubling to
// 5 min), because what is measured is the real write budget.
package failure

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
)

func TestMain(m *testing.M) {
	// The default Backoff: what these tests measure.
	os.Exit(testenv.RunWithControllers(m, testenv.Options{}, manager.Options{MachineWorkers: 4}, testenv.Leases{},
		func(e *testenv.Env, c *testenv.Controllers) { env, controllers = e, c }))
}

func class(t *testing.T, c client.Client, ns, name, provider, providerSpec string) *machinistv1.MachineClass {
	t.Helper()
	mc := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineClassSpec{Provider: provider},
	}
	if providerSpec != "" {
		mc.Spec.ProviderSpec = runtime.RawExtension{Raw: []byte(providerSpec)}
	}
	if err := c.Create(context.Background(), mc); err != nil {
		t.Fatal(err)
	}
	return mc
}

// machine creates a Machine with the finalizer already set, as a
// MachineSet makes them, so that every write counted is the controller's
// status write.
func machine(t *testing.T, c client.Client, ns, name, class string) *machinistv1.Machine {
	t.Helper()
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, Version: "v1.37.2"},
	}
	if err := c.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

func get(t *testing.T, c client.Client, m *machinistv1.Machine) *machinistv1.Machine {
	t.Helper()
	out := &machinistv1.Machine{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(m), out); err != nil {
		t.Fatal(err)
	}
	return out
}

func ready(m *machinistv1.Machine) *metav1.Condition {
	return meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
}

// writeLog counts, per object name, the writes a watch shows: every
// Modified event is one write that changed the object.
type writeLog struct {
	mu     sync.Mutex
	writes map[string]int
}

func (w *writeLog) of(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes[name]
}

func (w *writeLog) all() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.writes {
		out[k] = v
	}
	return out
}

// countWrites watches one kind in ns (newList makes an empty list of it)
// from now on, until the test ends.
func countWrites(t *testing.T, e *testenv.Env, ns string, newList func() client.ObjectList) *writeLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	events, err := e.Watch(ctx, ns, newList)
	if err != nil {
		t.Fatal(err)
	}
	w := &writeLog{writes: map[string]int{}}
	go func() {
		for ev := range events {
			o, ok := ev.Object.(client.Object)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			w.mu.Lock()
			w.writes[o.GetName()]++
			w.mu.Unlock()
		}
	}()
	return w
}

// warnings returns the Warning Events about the named object in ns.
func warnings(t *testing.T, c client.Client, ns, name string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Type == corev1.EventTypeWarning {
			out = append(out, e)
		}
	}
	return out
}

// describeEvents is for failure messages.
func describeEvents(es []eventsv1.Event) string {
	var b strings.Builder
	for _, e := range es {
		count := int32(1)
		if e.Series != nil {
			count = e.Series.Count
		}
		fmt.Fprintf(&b, "\n  %s %s x%d: %s", e.Type, e.Reason, count, e.Note)
	}
	return b.String()
}

// oneWarning checks that the named object has exactly one Warning Event,
// with reason, seen once: one Event per change of state, not per retry.
// The events library folds repeats into a series, so a series counts as
// repeats too.
func oneWarning(t *testing.T, c client.Client, ns, name, reason string) {
	t.Helper()
	var es []eventsv1.Event
	// Events are written in the background after the status that
	// explains them.
	testenv.WaitFor(t, 10*time.Second, "a Warning Event "+reason, func() bool {
		es = warnings(t, c, ns, name)
		return len(es) > 0
	})
	if len(es) != 1 || es[0].Reason != reason || (es[0].Series != nil && es[0].Series.Count > 1) {
		t.Fatalf("want one Warning Event %s about %s, seen once; got:%s", reason, name, describeEvents(es))
	}
}
