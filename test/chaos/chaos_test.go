package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/machinist-dev/machinist/dev/testenv"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// TestKill kills the manager with SIGKILL, once or twice at random moments,
// while it does the seed's scenario; the supervisor starts it again each
// time, and the run must converge with the books straight.
func TestKill(t *testing.T) {
	var names []string
	for _, sc := range scenarios {
		names = append(names, sc.name)
	}
	var midWork, after int
	defer func() {
		t.Logf("TestKill: %d kills, %d of them mid-work and %d after the work was done", midWork+after, midWork, after)
	}()
	forEachScenario(t, names, func(t *testing.T, r *run, i int) {
		sc := scenarios[i]
		rep := r.startReplica("a")
		r.waitLeader(rep)
		sc.setup(r)
		began := time.Now()
		window := sc.act(r)
		kills := 1 + r.rng.IntN(2)
		var at []time.Time
		if sc.versions > 0 {
			// After a random number of the work's Machine versions.
			points := []int{1 + r.rng.IntN(sc.versions-1), 1 + r.rng.IntN(sc.versions-1)}[:kills]
			slices.Sort(points)
			for i, n := range points {
				r.monitor.awaitProgress(began, n, 3*time.Second)
				rep.kill()
				at = append(at, time.Now())
				r.note("kill -9 %d of %d after %d Machine versions of about %d, %v into the work", i+1, kills, n, sc.versions, time.Since(began).Round(time.Millisecond))
			}
		} else {
			for i := range kills {
				d := r.between(0, window/time.Duration(kills))
				// On purpose: the kills land at random moments of the window.
				time.Sleep(d)
				rep.kill()
				at = append(at, time.Now())
				r.note("kill -9 %d of %d, %v into its share of the %v window", i+1, kills, d.Round(time.Millisecond), window.Round(time.Millisecond))
			}
		}
		r.verify(sc.want)
		stored, _ := r.monitor.versionsSince(began)
		r.note("converged %v after the work began, which stored %d Machine versions", time.Since(began).Round(time.Millisecond), stored)
		// A kill that struck after the work was done proves little; say
		// which did not. The restarted manager cannot write within 2s of
		// a kill (the Lease outlives its holder), so what comes later is
		// work the kill interrupted.
		for i, k := range at {
			if _, ok := r.monitor.firstWrite(arrivedAfter(k.Add(2 * time.Second))); !ok {
				r.note("kill %d struck after the work was done", i+1)
				after++
			} else {
				r.note("kill %d struck mid-work", i+1)
				midWork++
			}
		}
		if exits := rep.unplannedExits(); len(exits) > 0 {
			t.Errorf("the manager exited %d times unbidden; last:\n%s", len(exits), exits[len(exits)-1].Tail)
		}
	})
}

// verify waits until want holds, then checks the books, the invariants
// and that every operation was carried out exactly once.
func (r *run) verify(want func(*run) error) {
	r.t.Helper()
	r.wait("convergence", func() error { return want(r) })
	if err := r.checkProvider(); err != nil {
		r.t.Error(err)
	}
	if err := r.checkOnce(); err != nil {
		r.t.Error(err)
	}
	v := r.monitor.check()
	r.note("monitor: %s", v)
	if len(v.breaches) > 0 {
		r.t.Errorf("invariants broken: %s", v)
	}
}

// waitLeader waits until rep holds the leader Lease.
func (r *run) waitLeader(rep *replica) {
	r.t.Helper()
	if err := testenv.Poll(time.Minute, func() error {
		if !rep.leading() {
			return errLeader
		}
		return nil
	}); err != nil {
		r.t.Fatalf("%s: %v\n%s", rep.name, err, rep.output())
	}
}

var errLeader = errors.New("not the leader yet")

// TestFailover runs two replicas and kills the leader at a random moment
// of a rolling upgrade; the other must take over and finish it. The
// killed replica comes back only after the failover, so that the time
// measured is the standby's. Failover time runs from the kill to the first
// write of the new leader's controllers.
func TestFailover(t *testing.T) {
	forEachSeed(t, func(t *testing.T, r *run) {
		a, b := r.startReplica("a"), r.startReplica("b")
		leader, standby := r.whichLeads(a, b)
		surge := int32(1 + r.rng.IntN(3))
		r.createDeployment(10, rolling(surge, int32(r.rng.IntN(2))), "v1.37.1")
		r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		began := time.Now()
		r.setVersion("v1.37.2")
		// A rollout of 10 stores some 60 Machine versions.
		r.monitor.awaitProgress(began, 1+r.rng.IntN(50), 3*time.Second)
		leader.hold()
		killed := time.Now()
		leader.kill()
		lease, took := r.awaitNewHolder(killed)
		// The killed leader is held back, so the new holder can only be
		// the standby; it logs so just after its write.
		if err := testenv.Poll(10*time.Second, func() error {
			if !standby.leading() {
				return errLeader
			}
			return nil
		}); err != nil {
			t.Errorf("the standby did not take over: %v\n%s", err, standby.output())
		}
		leader.release()
		r.verify(func(r *run) error { return r.deploymentSettled("v1.37.2") })
		// Read once the work is done: the new leader writes after it
		// takes the Lease.
		if first, ok := r.monitor.firstWrite(storedAfter(lease)); ok {
			r.note("failover (Lease %v, renew deadline %v, retry %v): the Lease changed hands %v after the kill; the new leader's first write came %v after the kill",
				leaseDuration, renewDeadline, retryPeriod, took.Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond))
		} else {
			r.note("failover: the Lease changed hands %v after the kill; the rollout had finished before it", took.Round(time.Millisecond))
		}
		for _, rep := range []*replica{a, b} {
			if exits := rep.unplannedExits(); len(exits) > 0 {
				t.Errorf("%s exited %d times unbidden; last:\n%s", rep.name, len(exits), exits[len(exits)-1].Tail)
			}
		}
	})
}

// remediated lists the Machines a health check ever climbed a rung for
// (rebooted, repaired or replaced), from every version the monitor saw.
func (r *run) remediated() []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range r.monitor.ordered() {
		m, ok := e.obj.(*machinistv1.Machine)
		if !ok || m.Status.Remediation == nil {
			continue
		}
		switch m.Status.Remediation.Phase {
		case machinistv1.RemediationRebooting, machinistv1.RemediationRepairing, machinistv1.RemediationReplacing:
		default:
			continue
		}
		if !seen[m.Name] {
			seen[m.Name] = true
			out = append(out, fmt.Sprintf("%s (%s)", m.Name, m.Status.Remediation.Phase))
		}
	}
	return out
}

// whichLeads waits until one of two replicas leads and returns it first.
func (r *run) whichLeads(a, b *replica) (leader, standby *replica) {
	r.t.Helper()
	err := testenv.Poll(time.Minute, func() error {
		switch {
		case a.leading():
			leader, standby = a, b
		case b.leading():
			leader, standby = b, a
		default:
			return errLeader
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return leader, standby
}

// awaitNewHolder polls the leader Lease until its holder changes after a
// kill, and returns the Lease's resourceVersion then and how long it took.
func (r *run) awaitNewHolder(killed time.Time) (string, time.Duration) {
	r.t.Helper()
	ctx := context.Background()
	key := client.ObjectKey{Namespace: leaseNamespace, Name: "machinist-manager"}
	lease := &coordinationv1.Lease{}
	r.must(env.Client.Get(ctx, key, lease))
	holder := ptrValue(lease.Spec.HolderIdentity)
	for {
		if err := env.Client.Get(ctx, key, lease); err == nil && ptrValue(lease.Spec.HolderIdentity) != holder {
			return lease.ResourceVersion, time.Since(killed)
		}
		if time.Since(killed) > time.Minute {
			r.t.Fatalf("the Lease is still held by %s a minute after its holder was killed", holder)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ptrValue(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// outages are TestAPIServerRestart's scenarios: which cluster's
// kube-apiserver is stopped. Before the Nodes moved to a workload cluster
// one outage did both things at once: the manager lost its leader Lease
// and its watch of the Nodes, and the kubelets could not report. Now they
// are two outages, each of its own cluster, and each is a scenario.
var outages = []struct {
	name string
	env  func() *testenv.Env
	// leaderLost says the manager's leader Lease is in the stopped
	// cluster: the leader must give its term up and exit once; otherwise
	// the manager must not exit at all.
	leaderLost bool
}{
	{name: "management kube-apiserver", env: func() *testenv.Env { return env }, leaderLost: true},
	{name: "workload kube-apiserver", env: func() *testenv.Env { return workload }},
}

// TestAPIServerRestart stops a kube-apiserver for 20s at a random moment
// of a rolling upgrade, and starts it again over the same etcd; the
// rollout must finish, and a MachineHealthCheck over the fleet must
// remediate nothing.
//
// The management cluster's: the leader cannot renew its Lease meanwhile,
// so it exits with "leader election lost", which the supervisor (a
// Deployment, in a cluster) restarts; the new process waits for
// kube-apiserver without exiting, takes the Lease when it is back and
// finishes the rollout. The kubelets keep reporting to the workload
// cluster throughout, so here the health check only has to judge the
// Nodes afresh from the restarted manager's new connection.
//
// The workload cluster's: what the management outage used to prove about
// Nodes, that the health check does not remediate on conditions that went
// stale while the API it watches was away, now concerns the manager's
// watch of the workload cluster, and this outage is the one that makes
// them stale: the agents cannot renew their Leases, the manager's watch of
// the Nodes fails, and the new Machines cannot join until it is back. The
// manager's leader Lease lives in the management cluster, so the manager
// must not exit.
func TestAPIServerRestart(t *testing.T) {
	var names []string
	for _, o := range outages {
		names = append(names, o.name)
	}
	forEachScenario(t, names, func(t *testing.T, r *run, i int) {
		outage := outages[i]
		down := outage.env()
		rep := r.startReplica("a")
		r.waitLeader(rep)
		r.createDeployment(10, rolling(int32(1+r.rng.IntN(3)), int32(r.rng.IntN(2))), "v1.37.1")
		r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		// A health check over the fleet, which the outage must not fool.
		r.must(env.Client.Create(context.Background(), healthCheck(r.ns, mdName)))
		began := time.Now()
		r.setVersion("v1.37.2")
		r.monitor.awaitProgress(began, 1+r.rng.IntN(50), 3*time.Second)
		r.must(down.StopAPIServer())
		stopped := time.Now()
		// On purpose: kube-apiserver stays down for twenty seconds.
		time.Sleep(20 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r.must(down.StartAPIServer(ctx))
		back := time.Now()
		r.note("the %s was down %v, from %v into the rollout", outage.name, back.Sub(stopped).Round(time.Millisecond), stopped.Sub(began).Round(time.Millisecond))
		r.verify(func(r *run) error { return r.deploymentSettled("v1.37.2") })
		if _, ok := r.monitor.firstWrite(arrivedAfter(back)); ok {
			r.note("the outage struck mid-work: Machines, sets or the rollout were written after it")
		} else {
			r.note("nothing was written after the outage: the rollout had finished before it")
		}
		if healed := r.remediated(); len(healed) > 0 {
			t.Errorf("the health check remediated healthy Machines after the outage: %v", healed)
		}
		// What an operator sees: at most one exit, that one clean and
		// saying why, and only when the leader Lease was out of reach; no
		// crash loop and no panic.
		exits := rep.checkLeaderExits(t, outage.leaderLost, "its leader Lease stayed within reach")
		r.note("the manager exited %d times during the outage", len(exits))
		r.waitLeader(rep)
	})
}
