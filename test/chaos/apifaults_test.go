package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// writes and ours scope the API faults: every write and read of
// Machinist's kinds, of Nodes and of evictions, but not the leader
// Lease (losing the lead is TestFailover's and TestAPIServerRestart's
// business) nor the agents' own requests, which go direct as a
// kubelet's would.
//
// The proxy stands between the manager and the management cluster only.
// The run's Machines serve the workload cluster, so what the manager does
// to their Nodes (cordons, taints, evictions, pod deletions, bootstrap
// tokens) goes to the workload cluster directly and is not struck: these
// runs prove the Machine, set and rollout writes under faults, and the
// Node-side rules strike only the manager's requests for its own
// cluster's Nodes, of which the runs have none. Lost replies to Node-side
// writes are test/apifaults' business.
var (
	writes = []string{"create", "update", "patch", "delete"}
	ours   = []string{
		"machines", "machines/status", "machinesets", "machinesets/status", "machinedeployments", "machinedeployments/status",
		"machinedisruptionbudgets", "machinedisruptionbudgets/status", "machinehealthchecks", "machinehealthchecks/status",
		"nodes", "pods", "pods/eviction",
	}
)

// apiFaults is what the proxy does to the manager's requests in
// TestAPIFaults: about one request in eight of Machinist's is struck.
func apiFaults(seed uint64) faults.Config {
	return faults.Config{Seed: seed, Rules: []faults.Rule{
		{Name: "lost replies", Fault: faults.LoseReply, Verbs: writes, Resources: ours, Rate: 0.05},
		{Name: "late commits", Fault: faults.LateCommit, Verbs: writes, Resources: ours, Rate: 0.02,
			Delay: metav1.Duration{Duration: 2 * time.Second}},
		{Name: "503s", Fault: faults.Unavailable, Resources: ours, Rate: 0.02},
		{Name: "429s", Fault: faults.Throttle, Resources: ours, Rate: 0.02, Delay: metav1.Duration{Duration: time.Second}},
		{Name: "latency", Fault: faults.Latency, Verbs: append([]string{"get", "list"}, writes...), Resources: ours, Rate: 0.05,
			Delay: metav1.Duration{Duration: 300 * time.Millisecond}},
		{Name: "cut watches", Fault: faults.CutWatch, Resources: ours, Rate: 0.5, Delay: metav1.Duration{Duration: 15 * time.Second}},
	}}
}

// apiScenarios are what the manager does while the proxy strikes.
var apiScenarios = []struct {
	name  string
	setup func(r *run)
	act   func(r *run) func(*run) error
}{
	{
		name:  "scale-up 0→30",
		setup: func(r *run) { r.createSet(0, nil) },
		act: func(r *run) func(*run) error {
			r.scaleSet(30)
			return func(r *run) error { return r.setSettled(30) }
		},
	},
	{
		name: "rolling upgrade of 20, maxSurge 3",
		setup: func(r *run) {
			r.createDeployment(20, rolling(3, 0), "v1.37.1")
			r.wait("20 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act: func(r *run) func(*run) error {
			r.setVersion("v1.37.2")
			return func(r *run) error { return r.deploymentSettled("v1.37.2") }
		},
	},
	{
		name: "in-place rollout of 10, maxUnavailable 2",
		setup: func(r *run) {
			r.createDeployment(10, inPlace(2), "v1.37.1")
			r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act: func(r *run) func(*run) error {
			r.setVersion("v1.37.2")
			return func(r *run) error { return r.deploymentSettled("v1.37.2") }
		},
	},
	{
		name: "remediation of a crashed machine",
		setup: func(r *run) {
			r.createSet(4, nil)
			r.wait("4 Machines Running", func() error { return r.setSettled(4) })
			r.must(env.Client.Create(context.Background(), healthCheck(r.ns, setName)))
			r.wait("the health check to count 4 healthy Machines", func() error { return r.healthy(4) })
		},
		act: func(r *run) func(*run) error {
			ms := r.machineList()
			victim := ms[r.rng.IntN(len(ms))]
			r.crashAgent(victim)
			r.note("crashed %s", victim.Name)
			return func(r *run) error { return errors.Join(r.setSettled(4), r.healthy(4), r.healed(victim)) }
		},
	},
}

// TestAPIFaults runs the manager through a proxy that loses replies,
// stores requests after answering 504, answers 503 and 429, adds latency
// and cuts watches, while it scales up, rolls out (replacing, and in
// place) and heals a crashed machine. Every count must come out exact:
// no slot filled twice, no Machine leaked or missing, every operation
// carried out once, and the invariants of every stored version.
func TestAPIFaults(t *testing.T) {
	var names []string
	for _, sc := range apiScenarios {
		names = append(names, sc.name)
	}
	totals := map[string]int{}
	var lateStored, lateRefused int
	defer func() {
		t.Logf("TestAPIFaults, faults struck in all: %s; late commits stored %d, refused %d", summary(totals), lateStored, lateRefused)
	}()
	forEachScenario(t, names, func(t *testing.T, r *run, i int) {
		sc := apiScenarios[i]
		p, err := faults.Start(env.Config, apiFaults(r.seed), "127.0.0.1:0")
		r.must(err)
		r.proxy = p
		r.stops = append(r.stops, func() { _ = p.Close() })
		// Struck from the manager's first request, so that its watches
		// are cut too: a watch is only struck as it starts.
		rep := r.startReplica("a")
		r.waitLeader(rep)
		sc.setup(r)
		want := sc.act(r)
		r.verify(want)
		counts := p.Counts()
		stored, refused := p.Late()
		lateStored, lateRefused = lateStored+stored, lateRefused+refused
		byRule := map[string]int{}
		for _, c := range counts {
			byRule[c.Rule] = c.Struck
			totals[c.Rule] += c.Struck
		}
		r.note("faults struck: %s; late commits stored %d, refused %d", summary(byRule), stored, refused)
		if exits := rep.unplannedExits(); len(exits) > 0 {
			t.Errorf("the manager exited %d times unbidden; last:\n%s", len(exits), exits[len(exits)-1].Tail)
		}
	})
}

// summary prints counts per rule, in apiFaults' order.
func summary(counts map[string]int) string {
	var parts []string
	for _, r := range apiFaults(1).Rules {
		parts = append(parts, fmt.Sprintf("%s %d", r.Name, counts[r.Name]))
	}
	return strings.Join(parts, ", ")
}

// TestScaleUpUnderLostCreateReplies scales a MachineSet of the inmemory
// provider from 0 to 1,000 while 2% of the manager's Machine creates lose
// their reply and 1% are answered 504 and stored two seconds later. The
// monitor checks every stored version: no Machine may be created for a set
// that already has its replicas, and the set must end with exactly 1,000.
func TestScaleUpUnderLostCreateReplies(t *testing.T) {
	const n = 1000
	forEachSeed(t, func(t *testing.T, r *run) {
		p, err := faults.Start(env.Config, faults.Config{Seed: r.seed, Rules: []faults.Rule{
			{Name: "lost", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.02},
			{Name: "late", Fault: faults.LateCommit, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.01,
				Delay: metav1.Duration{Duration: 2 * time.Second}},
		}}, "127.0.0.1:0")
		r.must(err)
		r.stops = append(r.stops, func() { _ = p.Close() })
		// Kubelets that renew as kubelets do, every 10 s, inside
		// kube-controller-manager's nodeGrace: a thousand of them every
		// two seconds (agentRenew) would be the test's load, not the
		// set's, but a kubelet silent for nodeGrace turns its Node
		// Unknown, and on a slow machine filling the set takes longer
		// than that.
		provider, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: 40, RenewInterval: nodeGrace / 2, Seed: r.seed})
		r.must(err)
		r.managerInProcess(p.Config(), provider, provider, manager.Options{QPS: 500, Burst: 1000})
		r.createSet(0, nil)
		began := time.Now()
		r.scaleSet(n)
		r.verify(func(r *run) error { return r.setSettled(n) })
		stored, refused := p.Late()
		r.note("scaled 0→%d in %v: %d creates lost their reply, %d were answered 504 (%d of them stored later, %d refused as already there)",
			n, time.Since(began).Round(time.Millisecond), p.Struck("lost"), p.Struck("late"), stored, refused)
		if p.Struck("lost") == 0 {
			t.Error("no create lost its reply: the run proved nothing")
		}
	})
}
