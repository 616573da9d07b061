package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// clusterDownFlags make the manager find a workload cluster down within
// seconds, so that an outage of 15 to 35 seconds is one it acts on: the
// cluster's Machines are shown unseen, their health checks freeze and
// their drains wait.
var clusterDownFlags = []string{"--cluster-probe-period=2s", "--cluster-unreachable-after=4s"}

// workOutages are TestWorkloadClusterDown's scenarios: the work the
// workload cluster's kube-apiserver is killed in the middle of.
var workOutages = []string{"rolling upgrade", "remediation"}

// TestWorkloadClusterDown kills the workload cluster's kube-apiserver for
// 15 to 35 seconds, long enough to be found down, at a seeded moment of a
// rolling upgrade of 10 or of a health check's remediation of a crashed
// machine, and starts it again over the same etcd. The books must balance
// (no Machine twice for one slot, maxSurge and maxUnavailable kept, each
// operation carried out once), nothing may be remediated or replaced
// because of the outage, the work must finish, and the manager must not
// exit: its leader Lease is in the management cluster.
func TestWorkloadClusterDown(t *testing.T) {
	forEachScenario(t, workOutages, func(t *testing.T, r *run, i int) {
		ctx := context.Background()
		rep := r.startReplica("a", clusterDownFlags...)
		r.waitLeader(rep)
		var (
			began  time.Time
			victim *machinistv1.Machine
			want   func(*run) error
		)
		switch workOutages[i] {
		case "rolling upgrade":
			r.createDeployment(10, rolling(int32(1+r.rng.IntN(3)), int32(r.rng.IntN(2))), "v1.37.1")
			r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
			r.must(env.Client.Create(ctx, healthCheck(r.ns, mdName)))
			began = time.Now()
			r.setVersion("v1.37.2")
			r.monitor.awaitProgress(began, 1+r.rng.IntN(50), 3*time.Second)
			want = func(r *run) error { return r.deploymentSettled("v1.37.2") }
		case "remediation":
			r.createSet(4, nil)
			r.wait("4 Machines Running", func() error { return r.setSettled(4) })
			r.must(env.Client.Create(ctx, healthCheck(r.ns, setName)))
			r.wait("the health check to count 4 healthy Machines", func() error { return r.healthy(4) })
			ms := r.machineList()
			victim = &ms[r.rng.IntN(len(ms))]
			r.crashAgent(*victim)
			began = time.Now()
			// Half the seeds strike while the health check has still to
			// notice, half once its rung is under way.
			if r.rng.IntN(2) == 0 {
				time.Sleep(r.between(0, 10*time.Second)) // on purpose: a seeded moment
			} else if !r.monitor.awaitVersion(began, climbing(*victim), 3*time.Minute) {
				t.Fatalf("no rung of the ladder started for %s: %s", victim.Name, r.remediationOf(*victim))
			}
			v := *victim
			want = func(r *run) error { return errors.Join(r.setSettled(4), r.healthy(4), r.healed(v)) }
		}
		at := fmt.Sprintf("%d of 10 Machines at v1.37.2", r.atVersion("v1.37.2"))
		if victim != nil {
			at = r.remediationOf(*victim)
		}
		r.must(workload.StopAPIServer())
		stopped := time.Now()
		down := r.between(15*time.Second, 35*time.Second)
		time.Sleep(down) // on purpose: the outage's seeded length
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		r.must(workload.StartAPIServer(startCtx))
		r.note("the workload kube-apiserver was down %v, from %v into the %s (%s)", time.Since(stopped).Round(time.Millisecond),
			stopped.Sub(began).Round(time.Millisecond), workOutages[i], at)
		if seen := r.foundDown(stopped); seen != "" {
			r.note("the manager found it down: %s", seen)
		} else {
			t.Errorf("the manager never found the workload cluster down in a %v outage", down)
		}
		r.verify(want)
		healed := r.remediated()
		switch {
		case victim == nil && len(healed) > 0:
			t.Errorf("the health check remediated healthy Machines during a rollout and an outage: %v", healed)
		case victim != nil && (len(healed) != 1 || !strings.HasPrefix(healed[0], victim.Name+" ")):
			t.Errorf("the health check remediated %v; only the crashed %s needed it", healed, victim.Name)
		}
		if exits := rep.unplannedExits(); len(exits) > 0 {
			t.Errorf("the manager exited %d times though its leader Lease stayed within reach; last:\n%s", len(exits), exits[len(exits)-1].Tail)
		}
	})
}

// climbing passes a version of m whose health check's ladder has a rung
// under way.
func climbing(m machinistv1.Machine) func(client.Object) bool {
	return func(obj client.Object) bool {
		got, ok := obj.(*machinistv1.Machine)
		if !ok || got.UID != m.UID || got.Status.Remediation == nil {
			return false
		}
		switch got.Status.Remediation.Phase {
		case machinistv1.RemediationRebooting, machinistv1.RemediationRepairing, machinistv1.RemediationReplacing:
			return true
		}
		return false
	}
}

// foundDown says which Machine, stored since after, first showed its
// Node side unseen because the cluster was found down; "" when none did.
func (r *run) foundDown(after time.Time) string {
	for _, e := range r.monitor.ordered() {
		m, ok := e.obj.(*machinistv1.Machine)
		if !ok || e.at.Before(after) {
			continue
		}
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy); c != nil &&
			c.Reason == machinistv1.ReasonClusterUnreachable {
			return fmt.Sprintf("Machine %s %v after the stop: %s", m.Name, e.at.Sub(after).Round(time.Millisecond), c.Message)
		}
	}
	return ""
}

// atVersion counts the live Machines whose spec asks for version.
func (r *run) atVersion(version string) int {
	n := 0
	for _, m := range r.machineList() {
		if m.Spec.Version == version && m.DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n
}
