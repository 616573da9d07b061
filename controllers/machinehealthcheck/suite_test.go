package machinehealthcheck_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
)

// The node lifecycle controller of the real kube-controller-manager marks a
// silent kubelet's Node Ready=Unknown; short Leases make a crash show in
// seconds.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithControllers(m, testenv.Options{ControllerManager: true},
		manager.Options{MachineWorkers: 8, NodeGrace: 2 * time.Second},
		testenv.Leases{DurationSeconds: 4, RenewInterval: time.Second},
		func(e *testenv.Env, c *testenv.Controllers) { env, controllers = e, c }))
}

const wait = 90 * time.Second

func setup(t *testing.T, prefix, classSpec string) string {
	t.Helper()
	ns := env.NewNamespace(t, prefix, testenv.Class{Name: testenv.Small.Name, Spec: classSpec})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What a person would look at first.
		for _, args := range [][]string{
			{"get", "machines,machinehealthchecks", "-o", "wide"},
			{"get", "machines", "-o", "jsonpath={range .items[*]}{.metadata.name} boot={.status.bootID} last={.status.lastTransition}: {.status.remediation}; {.status.operation}{\"\\n\"}{end}"},
			{"get", "events", "--sort-by=.metadata.creationTimestamp"},
			{"get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.nodeInfo.bootID} {.status.conditions[?(@.type==\"Ready\")]}{\"\\n\"}{end}"},
		} {
			out, err := env.Kubectl(context.Background(), append([]string{"-n", ns}, args...)...)
			t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, errOrNil(err))
		}
	})
	return ns
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
}

func duration(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// healthCheck selects pool; Nodes NotReady or unreachable for a second
// are unhealthy.
func healthCheck(ns, pool string, ladder ...machinistv1.Rung) *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: ladder},
		},
	}
}

func rung(a machinistv1.RemediationAction, timeout time.Duration) machinistv1.Rung {
	r := machinistv1.Rung{Action: a}
	if timeout > 0 {
		r.Timeout = duration(timeout)
	}
	return r
}

func percent(s string) *intstr.IntOrString { v := intstr.Parse(s); return &v }

// running waits until ns holds n Machines, all Running with a Ready Node
// and passing their health check, and returns them.
func running(t *testing.T, ns string, n int) []machinistv1.Machine {
	t.Helper()
	var ms []machinistv1.Machine
	testenv.WaitFor(t, wait, fmt.Sprintf("%d Machines Running in %s", n, ns), func() bool {
		ms = env.Machines(t, ns)
		if len(ms) != n {
			return false
		}
		for _, m := range ms {
			if m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero() || !healthy(&m) {
				return false
			}
		}
		return true
	})
	return ms
}

func healthy(m *machinistv1.Machine) bool {
	for _, c := range m.Status.Conditions {
		if c.Type == machinistv1.ConditionNodeHealthy {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// seen is one Machine as a watch event showed it.
type seen struct {
	name      string
	uid       string
	phase     machinistv1.MachinePhase
	ladder    machinistv1.RemediationPhase
	rung      int32
	bootID    string
	deleted   bool
	operation string
	// remediating is the Remediating condition as status/reason.
	remediating string
}

// history records every change to the Machines of a namespace, in order.
type history struct {
	mu     sync.Mutex
	events []seen
}

func record(t *testing.T, ns string) *history {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := env.WatchMachines(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{}
	go func() {
		for e := range ch {
			m, ok := e.Object.(*machinistv1.Machine)
			if !ok {
				continue
			}
			s := seen{name: m.Name, uid: string(m.UID), phase: m.Status.Phase, bootID: m.Status.BootID, deleted: e.Type == watch.Deleted}
			if r := m.Status.Remediation; r != nil {
				s.ladder, s.rung = r.Phase, r.Rung
			}
			if op := m.Status.Operation; op != nil {
				s.operation = op.ID + " " + string(op.State)
			}
			for _, c := range m.Status.Conditions {
				if c.Type == machinistv1.ConditionRemediating {
					s.remediating = string(c.Status) + "/" + c.Reason
				}
			}
			h.mu.Lock()
			h.events = append(h.events, s)
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *history) all() []seen {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// caughtUp waits (up to 15s) until the watch has delivered what a read
// already showed: Machine name's latest event in remediation phase last
// on rung, or its deletion when last is empty.
func (h *history) caughtUp(t *testing.T, name string, last machinistv1.RemediationPhase, rung int32) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("the watch showing Machine %s %s", name, orDeleted(last)), func() bool {
		var latest *seen
		for _, s := range h.all() {
			if s.name == name {
				if last == "" && s.deleted {
					return true
				}
				latest = &s
			}
		}
		return last != "" && latest != nil && latest.ladder == last && latest.rung == rung
	})
}

func orDeleted(p machinistv1.RemediationPhase) string {
	if p == "" {
		return "deleted"
	}
	return string(p)
}

// ladder is the sequence of distinct remediation phases the Machine name
// went through.
func (h *history) ladder(name string) []machinistv1.RemediationPhase {
	var out []machinistv1.RemediationPhase
	for _, s := range h.all() {
		if s.name == name && s.ladder != "" && (len(out) == 0 || out[len(out)-1] != s.ladder) {
			out = append(out, s.ladder)
		}
	}
	return out
}

// phases is the sequence of distinct lifecycle phases of Machine name.
func (h *history) phases(name string) []machinistv1.MachinePhase {
	var out []machinistv1.MachinePhase
	for _, s := range h.all() {
		if s.name == name && s.phase != "" && (len(out) == 0 || out[len(out)-1] != s.phase) {
			out = append(out, s.phase)
		}
	}
	return out
}

// deleted reports whether a watch event showed Machine name deleted.
func (h *history) deleted(name string) bool {
	for _, s := range h.all() {
		if s.name == name && s.deleted {
			return true
		}
	}
	return false
}

// boots is how many different boot IDs Machine name reported.
func (h *history) boots(name string) int {
	ids := map[string]bool{}
	for _, s := range h.all() {
		if s.name == name && s.bootID != "" {
			ids[s.bootID] = true
		}
	}
	return len(ids)
}

// events lists the Events with reason on objects in ns, waiting up to 15s
// for at least atLeast of them: the recorder sends Events after the write
// that they follow, in the background.
func events(t *testing.T, ns, reason string, atLeast int) []eventsv1.Event {
	t.Helper()
	var out []eventsv1.Event
	// Fewer after 15s is for the caller to judge: the Events so far.
	_ = testenv.Poll(15*time.Second, func() bool {
		var list eventsv1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		out = out[:0]
		for _, e := range list.Items {
			if e.Reason == reason {
				out = append(out, e)
			}
		}
		return len(out) >= atLeast
	})
	return out
}

func get(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatal(err)
	}
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func actuatorOp(id string) providers.Operation { return providers.Operation{ID: id} }
