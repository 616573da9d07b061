package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// orphanGrace is the managers' --orphan-deletion-grace in the restore
// test: an instance no Machine claims is deleted this long after it is
// first seen.
const orphanGrace = 4 * time.Second

// mixedFor is how long after kube-apiserver is back a manager that ran
// through the restore may act on caches that mix restored kinds with
// kinds not yet listed again (see restore.mixed).
const mixedFor = 15 * time.Second

// heldFor stands for the MachinistGhostMachines alert's wait: how long
// after the inventory says it holds ghosts a person deletes them.
const heldFor = 15 * time.Second

// restoreFlags list the providers every second (the default is a minute)
// and delete orphans after orphanGrace (the default never does).
var restoreFlags = []string{"--inventory-period=1s", "--orphan-deletion-grace=" + orphanGrace.String()}

// restoreWork is a scenario of TestManagementClusterRestored: the work
// under way when the snapshot is taken.
type restoreWork struct {
	name string
	// setup makes the fleet the work starts from and waits until it is
	// settled.
	setup func(r *run)
	// act starts the work.
	act func(r *run)
	// versions is about how many Machine versions the work stores (10
	// for the scale-down, about 25 for the others): the snapshot is
	// taken after a random number of them. A set creates or deletes its
	// Machines in a burst of the first few, within a second.
	versions int
	// early: a third of the seeds take the snapshot before the work
	// starts, so that the restore brings back the older spec and the
	// whole work is undone. Not for the rollout: a backup from before a
	// rollout that finished leaves every Machine of the restored set a
	// ghost, more than --ghost-replacement-limit lets the inventory
	// replace (a provider that lost its books looks the same), which is
	// a person's to finish (operations.md), not this test's.
	early bool
	// want reports whether the fleet is where the restored spec asks.
	want func(r *run) error
}

var restoreWorks = []restoreWork{
	{
		name: "scale-up 3→8",
		setup: func(r *run) {
			r.createSet(3, nil)
			r.wait("3 Machines Running", func() error { return r.setSettled(3) })
		},
		act:      func(r *run) { r.scaleSet(8) },
		versions: 8,
		early:    true,
		want:     (*run).setAsSpecified,
	},
	{
		// To 5, not fewer: from an early snapshot, 3 of the set's 8
		// Machines come back as ghosts, within the 50% the inventory
		// replaces at once.
		name: "scale-down 8→5",
		setup: func(r *run) {
			r.createSet(8, nil)
			r.wait("8 Machines Running", func() error { return r.setSettled(8) })
		},
		act:      func(r *run) { r.scaleSet(5) },
		versions: 6,
		early:    true,
		want:     (*run).setAsSpecified,
	},
	{
		name: "rolling upgrade of 6, maxSurge 2",
		setup: func(r *run) {
			r.createDeployment(6, rolling(2, 0), "v1.37.1")
			r.wait("6 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act:      func(r *run) { r.setVersion("v1.37.2") },
		versions: 28,
		want:     func(r *run) error { return r.deploymentSettled("v1.37.2") },
	},
	{
		name: "5 reboots through the verbs server",
		setup: func(r *run) {
			r.createSet(5, nil)
			r.wait("5 Machines Running", func() error { return r.setSettled(5) })
		},
		act: func(r *run) {
			r.requestAll("reboot", `{"apiVersion":"subresources.machinist.dev/v1alpha1","kind":"RebootOptions"}`)
		},
		versions: 20,
		// Every reboot was requested before the snapshot: each is the
		// last operation of its Machine, succeeded, and (checkOnce)
		// carried out once.
		want: func(r *run) error { return errors.Join(r.setSettled(5), r.opsSucceeded()) },
	},
}

// setAsSpecified reports whether the MachineSet has settled at the
// replicas its spec asks for now: the restored spec.
func (r *run) setAsSpecified() error {
	s := &machinistv1.MachineSet{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: r.ns, Name: setName}, s); err != nil {
		return err
	}
	return r.setSettled(*s.Spec.Replicas)
}

// TestManagementClusterRestored snapshots the management cluster's etcd
// (etcdctl snapshot save) after a random number of the Machine versions
// a piece of work stores, or for a third of the scale seeds just before
// it starts, lets the work go on for a random 0.2–5 s, so
// that instances are made, deleted and rebooted after the snapshot, and
// then restores the snapshot (etcdutl snapshot restore, kube-apiserver
// and etcd stopped and started again). Half the seeds do as the
// documented procedure says, the manager stopped before the restore and
// started after it; the other half leave it running through it, as an
// operator who forgot would.
//
// After it, the fleet must lose nothing, leak nothing and repeat nothing:
// it converges to the restored spec, all Running; the provider holds an
// instance for every Machine and none else, so the instances made since
// the snapshot (orphans) were reported and deleted after the grace, and
// the Machines brought back whose instances were deleted since (ghosts)
// are gone, replaced at most once each; each Machine's Node is there and
// no Node of the run's instances is without a Machine; every operation
// was carried out once (a reboot done after the snapshot and in flight
// again in the restored status is not done twice); and the monitor's
// invariants hold in each branch of history (see monitor.check), except
// that a manager left running through the restore may fill a set's slots
// twice for a few seconds, while its caches mix restored kinds with kinds
// not yet listed again (restore.mixed): those are counted and reported,
// and the set must delete the extra Machines again.
func TestManagementClusterRestored(t *testing.T) {
	var names []string
	for _, w := range restoreWorks {
		names = append(names, w.name)
	}
	forEachScenario(t, names, func(t *testing.T, r *run, i int) {
		ctx := context.Background()
		w := restoreWorks[i]
		rep := r.startReplica("a", restoreFlags...)
		r.waitLeader(rep)
		w.setup(r)

		snapshot := filepath.Join(r.dir, "etcd.snapshot")
		early := w.early && r.rng.IntN(3) == 0
		after := 0
		if early {
			r.must(env.SnapshotEtcd(ctx, snapshot))
		}
		began := time.Now()
		w.act(r)
		if !early {
			after = 1 + r.rng.IntN(w.versions)
			r.monitor.awaitProgress(began, after, 3*time.Second)
			r.must(env.SnapshotEtcd(ctx, snapshot))
		}
		taken := time.Now()
		before, _ := r.monitor.versionsSince(began)
		rev := snapshotRevision(r, snapshot)
		// On purpose: the work goes on for a seeded while after the
		// snapshot, or is done by the restore.
		time.Sleep(r.between(200*time.Millisecond, 5*time.Second))
		stopped := r.rng.IntN(2) == 0
		if stopped {
			rep.stop()
		}
		down := time.Now()
		restoreCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		r.must(env.RestoreEtcd(restoreCtx, snapshot))
		back := time.Now()

		// What the restore left: the snapshot's Machines, against the
		// instances the provider holds now.
		held := r.books().dirs
		restored := r.monitor.machinesAt(rev)
		ghosts := map[types.UID]bool{}
		var ghostNames []string
		for uid, m := range restored {
			if _, ok := held[uid]; !ok && m.DeletionTimestamp == nil && m.Status.ProviderID != "" {
				ghosts[uid] = true
				ghostNames = append(ghostNames, m.Name)
			}
		}
		orphans := map[types.UID]string{}
		for uid, in := range held {
			if _, ok := restored[uid]; !ok {
				orphans[uid] = in.ProviderID
			}
		}
		var mixed time.Time
		if !stopped {
			// The informers list again within seconds of kube-apiserver's
			// return (their watches fail, and retry on a backoff).
			mixed = back.Add(mixedFor)
		}
		r.monitor.restored(rev, down, ghosts, mixed)
		slices.Sort(ghostNames)
		how := "with the manager running through it"
		if stopped {
			how = "with the manager stopped before it and started after it"
		}
		when := fmt.Sprintf("%v into the %s", taken.Sub(began).Round(time.Millisecond), w.name)
		if early {
			when = "before the " + w.name
		}
		r.note("snapshot (revision %d) %s; restored %v later, %s; etcd and kube-apiserver back in %v; %d Machines restored, %d orphans (instances made since), %d ghosts %v (instances deleted since)",
			rev, when, down.Sub(taken).Round(time.Millisecond), how,
			back.Sub(down).Round(time.Millisecond), len(restored), len(orphans), len(ghosts), ghostNames)
		if stopped {
			rep = r.startReplica("b", restoreFlags...)
		}

		byHand := map[types.UID]bool{}
		r.wait("convergence after the restore", func() error {
			r.followRunbook(ghosts, byHand)
			return errors.Join(w.want(r), r.checkProvider(), r.checkNodes())
		})
		if len(byHand) > 0 {
			r.note("%d ghosts held by --ghost-replacement-limit (GhostsNotReplaced) and deleted by hand, as the runbook says", len(byHand))
		}
		stored, _ := r.monitor.versionsSince(began)
		r.note("converged %v after kube-apiserver was back; %d Machine versions had arrived when the snapshot was saved (it was started after %d; etcdctl takes about a second), of the %d seen since the work began",
			time.Since(back).Round(time.Millisecond), before, after, stored)
		if err := r.checkOnce(); err != nil {
			t.Error(err)
		}
		v := r.monitor.check()
		r.note("monitor: %s", v)
		if len(v.breaches) > 0 {
			t.Errorf("invariants broken: %s", v)
		}
		r.checkInventory(back, restored, orphans, ghosts)

		// The manager exits at most once, and then because it lost its
		// leader Lease while kube-apiserver was down.
		exits := rep.checkLeaderExits(t, !stopped, "it was started after the restore")
		if !stopped {
			r.note("the manager exited %d times through the restore", len(exits))
		}
	})
}

// snapshotRevision is the etcd revision a snapshot file holds, as
// etcdutl reads it.
func snapshotRevision(r *run, path string) uint64 {
	out, err := exec.Command(filepath.Join(testenv.BinDir(), "etcdutl"), "snapshot", "status", path, "--write-out", "json").Output()
	r.must(err)
	var st struct {
		Revision uint64 `json:"revision"`
	}
	r.must(json.Unmarshal(out, &st))
	if st.Revision == 0 {
		r.t.Fatalf("etcdutl snapshot status: no revision in %s", out)
	}
	return st.Revision
}

// checkNodes reports whether every live Machine of the run has its Node
// in the workload cluster, and no Node there is of an instance of the
// run's that no Machine has.
func (r *run) checkNodes() error {
	nodes := &corev1.NodeList{}
	if err := workload.Client.List(context.Background(), nodes); err != nil {
		return err
	}
	byID := map[string]string{}
	for _, n := range nodes.Items {
		if strings.HasPrefix(n.Spec.ProviderID, "process:///"+r.ns+"/") {
			byID[n.Spec.ProviderID] = n.Name
		}
	}
	var problems []string
	for _, m := range r.machineList() {
		if _, ok := byID[m.Status.ProviderID]; !ok {
			problems = append(problems, fmt.Sprintf("Machine %s has no Node of its instance %q", m.Name, m.Status.ProviderID))
		}
		delete(byID, m.Status.ProviderID)
	}
	for id, name := range byID {
		problems = append(problems, fmt.Sprintf("Node %s of instance %q has no Machine", name, id))
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("nodes: %s", strings.Join(problems, "; "))
	}
	return nil
}

// checkInventory checks what the inventory said after the restore at
// back: each orphan reported, then deleted, once; each ghost replaced at
// most once, and no Machine but a ghost replaced. It notes when the
// first and last of each came.
func (r *run) checkInventory(back time.Time, restored map[types.UID]*machinistv1.Machine, orphans map[types.UID]string, ghosts map[types.UID]bool) {
	t := r.t
	list := &eventsv1.EventList{}
	r.must(env.Client.List(context.Background(), list, client.InNamespace(r.ns)))
	count := map[string]map[types.UID]int{}
	first, last := map[string]time.Time{}, map[string]time.Time{}
	for _, e := range list.Items {
		if e.Regarding.Kind != "Machine" {
			continue
		}
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.CreationTimestamp.Time
		}
		if count[e.Reason] == nil {
			count[e.Reason] = map[types.UID]int{}
		}
		count[e.Reason][e.Regarding.UID] += max(1, int(e.DeprecatedCount))
		if f, ok := first[e.Reason]; !ok || at.Before(f) {
			first[e.Reason] = at
		}
		if at.After(last[e.Reason]) {
			last[e.Reason] = at
		}
	}
	for uid, id := range orphans {
		if n := count[inventory.ReasonOrphanInstance][uid]; n != 1 {
			t.Errorf("orphan %s reported %d times, want once", id, n)
		}
		if n := count[inventory.ReasonOrphanDeleted][uid]; n != 1 {
			t.Errorf("orphan %s deleted %d times by the inventory, want once", id, n)
		}
	}
	for uid := range count[inventory.ReasonOrphanInstance] {
		if _, ok := orphans[uid]; !ok {
			t.Errorf("an instance of Machine UID %s was reported an orphan, which it was not at the restore", uid)
		}
	}
	replaced := 0
	for uid, n := range count[inventory.ReasonGhostReplaced] {
		m, ok := restored[uid]
		switch {
		case !ok || !ghosts[uid]:
			t.Errorf("Machine UID %s was replaced as a ghost, which it was not at the restore", uid)
		case n > 1:
			t.Errorf("ghost %s replaced %d times, want once", m.Name, n)
		}
		replaced += n
	}
	if n := len(count[inventory.ReasonGhostsHeld]); n > 0 {
		r.note("%d ghosts not replaced for being too many at once", n)
	}
	since := func(reason string) string {
		if f, ok := first[reason]; ok {
			return fmt.Sprintf(" (%v–%v after)", f.Sub(back).Round(100*time.Millisecond), last[reason].Sub(back).Round(100*time.Millisecond))
		}
		return ""
	}
	r.note("inventory: %d orphans reported%s and deleted%s; %d of %d ghosts replaced%s (the others deleted by their set's own work, or by hand)",
		len(count[inventory.ReasonOrphanInstance]), since(inventory.ReasonOrphanInstance), since(inventory.ReasonOrphanDeleted),
		replaced, len(ghosts), since(inventory.ReasonGhostReplaced))
}

// followRunbook does what operations.md asks of a person when the
// inventory holds a set's ghosts for being too many at once
// (GhostsNotReplaced, MachinistGhostMachines): heldFor after that Event,
// it deletes the restore's ghosts still there, each once (byHand), for
// their sets to replace them. A restore can bring that many back: a
// rollout that finished after the snapshot deleted every Machine of the
// set the snapshot still holds.
func (r *run) followRunbook(ghosts, byHand map[types.UID]bool) {
	ctx := context.Background()
	list := &eventsv1.EventList{}
	if err := env.Client.List(ctx, list, client.InNamespace(r.ns)); err != nil {
		return
	}
	// A person comes when the alert fires, not at the first pass: what
	// the sets' own work deletes meanwhile (a rollout scaling the old set
	// down) is not theirs to do.
	if !slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.CreationTimestamp.Time
		}
		return e.Reason == inventory.ReasonGhostsHeld && time.Since(at) > heldFor
	}) {
		return
	}
	for _, m := range r.machineList() {
		if !ghosts[m.UID] || byHand[m.UID] || m.DeletionTimestamp != nil {
			continue
		}
		uid := m.UID
		if err := env.Client.Delete(ctx, &m, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) == nil {
			byHand[uid] = true
		}
	}
}
