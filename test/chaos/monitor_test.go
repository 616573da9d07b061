package chaos_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

// event is one stored version of an object, as a watch delivered it.
type event struct {
	rv   uint64
	at   time.Time
	typ  watch.EventType
	obj  client.Object
	gap  bool // seen by a list after the watch lost its place: versions before it may be missing
	kind string
}

// monitor watches a namespace's Machines, MachineSets and
// MachineDeployments in the management cluster, and all Nodes in the
// workload cluster, from the start of a run, and records every version it
// is sent. The invariants are checked afterwards by replaying the
// management cluster's versions in etcd's order (resourceVersion: one
// etcd, so one sequence), which a watch of each kind alone cannot give.
// The Nodes' versions come from the workload cluster's own etcd, so they
// are ordered among themselves only: what is read of them (bootIDs) is
// read per Node, and nothing orders them against a Machine's.
type monitor struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	events   []event
	gaps     int
	restores []restore
}

// restore is an etcd restore of the management cluster during a run. It
// rewinds history: what etcd stored after the snapshot's revision rev is
// gone, and the objects are again as they were at rev (their versions
// keep their resourceVersions; later writes come after a revision bumped
// far past every lost one). at is when kube-apiserver went down for it;
// ghosts are the snapshot's Machines whose instance was gone by then.
//
// mixed is when a manager that ran through the restore may still act on
// caches that mix kinds restored with kinds not yet listed again: its
// informers list again one kind at a time, as their watches fail, so for
// a moment a MachineSet may be seen restored and its Machines as they
// were before the restore, and the set creates Machines for slots that
// restored Machines fill (it deletes them again once it sees them).
// Kubernetes asks for its own controllers to be restarted after an etcd
// restore for this reason, and so does operations.md for the manager.
// Until mixed, a slot filled twice or a rollout's maxSurge exceeded is
// counted (verdict.mixed), not a breach; after it, it is a breach again.
// Zero when the manager was stopped for the restore.
type restore struct {
	rev    uint64
	at     time.Time
	ghosts map[types.UID]bool
	mixed  time.Time
}

// restored tells the monitor of a restore, so that check replays each
// branch of history on its own.
func (m *monitor) restored(rev uint64, at time.Time, ghosts map[types.UID]bool, mixed time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restores = append(m.restores, restore{rev: rev, at: at, ghosts: ghosts, mixed: mixed})
}

// lostTo reports whether restore r undid version e: stored after the
// snapshot, and seen before the restore.
func (r restore) lostTo(e event) bool { return e.rv > r.rev && e.at.Before(r.at) }

// machinesAt returns the Machines as etcd held them at revision rev, from
// the versions seen: what a snapshot taken at rev holds.
func (m *monitor) machinesAt(rev uint64) map[types.UID]*machinistv1.Machine {
	out := map[types.UID]*machinistv1.Machine{}
	for _, e := range m.ordered() {
		obj, ok := e.obj.(*machinistv1.Machine)
		if !ok || e.rv > rev {
			continue
		}
		if e.typ == watch.Deleted {
			delete(out, obj.UID)
		} else {
			out[obj.UID] = obj
		}
	}
	return out
}

func startMonitor(t *testing.T, ns string) *monitor {
	mgmt, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.NewWithWatch(workload.Config, client.Options{Scheme: workload.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &monitor{cancel: cancel}
	kinds := []struct {
		kind string
		list func() client.ObjectList
		ns   string
		c    client.WithWatch
	}{
		{"Machine", func() client.ObjectList { return &machinistv1.MachineList{} }, ns, mgmt},
		{"MachineSet", func() client.ObjectList { return &machinistv1.MachineSetList{} }, ns, mgmt},
		{"MachineDeployment", func() client.ObjectList { return &machinistv1.MachineDeploymentList{} }, ns, mgmt},
		{"Node", func() client.ObjectList { return &corev1.NodeList{} }, "", nodes},
	}
	ready := make(chan struct{}, len(kinds))
	for _, k := range kinds {
		m.wg.Go(func() { m.watch(ctx, k.c, k.kind, k.ns, k.list, ready) })
	}
	for range kinds {
		select {
		case <-ready:
		case <-time.After(time.Minute):
			t.Fatal("the monitor's watches did not start")
		}
	}
	return m
}

func (m *monitor) stop() {
	m.cancel()
	m.wg.Wait()
}

// watch follows one kind from a list, and after every break resumes from
// the last version seen; when that version is gone (410, as after a
// kube-apiserver restart) it lists again and marks what it finds as a gap.
func (m *monitor) watch(ctx context.Context, w client.WithWatch, kind, ns string, newList func() client.ObjectList, ready chan<- struct{}) {
	rv := ""
	relist := true
	first := true
	for ctx.Err() == nil {
		if relist {
			list := newList()
			if err := w.List(ctx, list, client.InNamespace(ns)); err != nil {
				// A pause before listing again, not to hammer a failing server.
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for _, obj := range objects(list) {
				m.record(kind, watch.Modified, obj, !first)
			}
			rv, relist = list.(metav1.ListInterface).GetResourceVersion(), false
			if first {
				ready <- struct{}{}
				first = false
			}
		}
		wi, err := w.Watch(ctx, newList(), client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{
			ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			relist = apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
			// A pause before watching again, not to hammer a failing server.
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for e := range wi.ResultChan() {
			if e.Type == watch.Error {
				if st, ok := e.Object.(*metav1.Status); ok && (st.Code == 410 || st.Reason == metav1.StatusReasonExpired || st.Reason == metav1.StatusReasonGone) {
					relist = true
				}
				break
			}
			obj, ok := e.Object.(client.Object)
			if !ok {
				continue
			}
			rv = obj.GetResourceVersion()
			if e.Type != watch.Bookmark {
				m.record(kind, e.Type, obj, false)
			}
		}
		wi.Stop()
		if relist {
			m.mu.Lock()
			m.gaps++
			m.mu.Unlock()
		}
	}
}

func (m *monitor) record(kind string, typ watch.EventType, obj client.Object, gap bool) {
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, event{rv: rv, at: time.Now(), typ: typ, obj: obj.DeepCopyObject().(client.Object), gap: gap, kind: kind})
}

// ordered returns every version seen, once each, in etcd's order.
func (m *monitor) ordered() []event {
	m.mu.Lock()
	all := slices.Clone(m.events)
	m.mu.Unlock()
	sort.SliceStable(all, func(i, j int) bool { return all[i].rv < all[j].rv })
	type key struct {
		kind string
		uid  types.UID
		rv   uint64
		del  bool
	}
	seen := map[key]bool{}
	out := all[:0]
	for _, e := range all {
		k := key{e.kind, e.obj.GetUID(), e.rv, e.typ == watch.Deleted}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, e)
	}
	return out
}

// firstWrite returns when the first Machine, MachineSet or
// MachineDeployment version that after accepts arrived: the first write of
// a controller, for nothing else writes those.
func (m *monitor) firstWrite(after func(event) bool) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var first time.Time
	for _, e := range m.events {
		if e.kind != "Node" && !e.gap && after(e) && (first.IsZero() || e.at.Before(first)) {
			first = e.at
		}
	}
	return first, !first.IsZero()
}

// arrivedAfter accepts the versions that arrived after t.
func arrivedAfter(t time.Time) func(event) bool { return func(e event) bool { return e.at.After(t) } }

// storedAfter accepts the versions etcd stored after resourceVersion rv.
func storedAfter(rv string) func(event) bool {
	after, err := strconv.ParseUint(rv, 10, 64)
	return func(e event) bool { return err == nil && e.rv > after }
}

// awaitProgress waits until n Machine versions have arrived since since,
// or none has for idle (the work is done, or stalled): a moment picked by
// the work's progress rather than the clock, so that a fault strikes
// mid-work however fast the host.
func (m *monitor) awaitProgress(since time.Time, n int, idle time.Duration) {
	last := time.Now()
	for {
		seen, latest := m.versionsSince(since)
		if seen >= n {
			return
		}
		if latest.After(last) {
			last = latest
		}
		if time.Since(last) > idle {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitVersion waits until a version arriving after since satisfies ok,
// or timeout passes, and reports whether one did. The watch pushes each
// version within milliseconds, so a fault can strike right after a write
// too brief for polling to catch.
func (m *monitor) awaitVersion(since time.Time, ok func(client.Object) bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	seen := 0
	for time.Now().Before(deadline) {
		m.mu.Lock()
		events := m.events[seen:]
		seen = len(m.events)
		m.mu.Unlock()
		for _, e := range events {
			if e.at.After(since) && ok(e.obj) {
				return true
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// versionsSince counts the Machine versions arrived since since, and says
// when the last one did.
func (m *monitor) versionsSince(since time.Time) (int, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, latest := 0, time.Time{}
	for _, e := range m.events {
		if e.kind == "Machine" && e.at.After(since) {
			n++
			if e.at.After(latest) {
				latest = e.at
			}
		}
	}
	return n, latest
}

// verdict is what the replay found.
type verdict struct {
	breaches    []string
	transitions int
	gapped      int // phase changes seen across a gap in the watch
	multi       int // phase changes of several moves in one write
	// mixed are the slots filled twice and maxSurge excesses of a
	// manager that ran through a restore, while its caches were mixed
	// (see restore.mixed); the first few are kept in mixedSeen.
	mixed     int
	mixedSeen []string
}

// check replays the recorded versions and checks the invariants:
//   - every stored change of a Machine's phase follows a path of the
//     lifecycle table (never backwards), and the transition it records is
//     a move of the table ending in the new phase;
//   - no MachineSet ever had a Machine created while it already had
//     spec.replicas live ones (a slot filled twice);
//   - no MachineDeployment had more Machines than replicas+maxSurge, or,
//     once all its replicas had been available, fewer in service than
//     replicas-maxUnavailable (see inService); a Recreate one never had
//     Machines of two MachineSets at once.
//
// A restore of etcd to an older snapshot (restored) forks history: the
// versions stored after the snapshot were real (the manager acted on
// them, and made and deleted instances for them), and then were undone.
// Each branch is replayed on its own and must hold the invariants: the
// one that ran up to the restore, and the one that goes on from the
// snapshot's state after it. In the latter, the snapshot's Machines whose
// instances were gone at the restore (ghosts) count as no Machine towards
// a rollout's maxSurge and availability, and a rollout's availability
// bound holds again only once all its replicas are available again and
// no ghost is left undeleted: the restore itself took those instances
// away (and the Machines made for them since the snapshot), which no
// controller did and none can undo at once, and until a ghost is found
// and deleted the rollout counts it available, as its restored status
// says. A set's slots count the ghosts, as the set does until they are
// deleted: it must not fill a slot twice across a restore either.
func (m *monitor) check() verdict {
	all := m.ordered()
	m.mu.Lock()
	restores := slices.Clone(m.restores)
	m.mu.Unlock()
	var v verdict
	seen := map[string]bool{}
	counted := map[string]bool{}
	for k := 0; k <= len(restores); k++ {
		var branch []event
		for _, e := range all {
			if slices.ContainsFunc(restores[:k], func(r restore) bool { return r.lostTo(e) }) {
				continue
			}
			if k < len(restores) && !e.at.Before(restores[k].at) {
				continue
			}
			branch = append(branch, e)
		}
		var from *restore
		if k > 0 {
			from = &restores[k-1]
		}
		replay(branch, from, &v, seen, counted)
	}
	return v
}

// replay checks one branch of history, in etcd's order; from is the
// restore it goes on from, if any. Breaches already found (seen) and
// phase changes already counted (counted) in an earlier branch, which
// shares its versions up to the snapshot, are not again.
func replay(events []event, from *restore, v *verdict, seen, counted map[string]bool) {
	machines := map[types.UID]*machinistv1.Machine{}
	sets := map[types.UID]*machinistv1.MachineSet{}
	mds := map[types.UID]*machinistv1.MachineDeployment{}
	armed := map[types.UID]bool{} // MachineDeployments that reached full availability
	// surged: MachineDeployments over maxSurge since a manager's mixed
	// caches after a restore (see restore.mixed).
	surged := map[types.UID]bool{}
	// history holds each set's sizes and hand-over lists as they changed,
	// for a breach to show how the set came to create.
	history := map[types.UID][]string{}
	breach := func(format string, args ...any) {
		b := fmt.Sprintf(format, args...)
		if len(v.breaches) < 20 && !seen[b] {
			seen[b] = true
			v.breaches = append(v.breaches, b)
		}
	}
	// mixedOr is breach, but for a version stored while a manager that
	// ran through the restore this branch goes on from had mixed caches.
	resumed := false
	mixedOr := func(e event, format string, args ...any) {
		if !resumed || !e.at.Before(from.mixed) {
			breach(format, args...)
			return
		}
		v.mixed++
		if len(v.mixedSeen) < 3 {
			v.mixedSeen = append(v.mixedSeen, fmt.Sprintf(format, args...))
		}
	}
	// resumed: the branch has reached the versions written after the
	// restore it goes on from.
	for _, e := range events {
		if from != nil && !resumed && e.rv > from.rev {
			resumed = true
			clear(armed)
			clear(surged)
		}
		switch obj := e.obj.(type) {
		case *machinistv1.Machine:
			old, existed := machines[obj.UID]
			if e.typ == watch.Deleted {
				delete(machines, obj.UID)
				continue
			}
			if !existed && !e.gap {
				if owner := setOf(obj); owner != "" {
					if s, ok := sets[owner]; ok {
						var live []string
						for _, o := range machines {
							if setOf(o) == owner && o.DeletionTimestamp == nil {
								live = append(live, o.Name)
							}
						}
						if s.Spec.Replicas != nil && int32(len(live)) >= *s.Spec.Replicas {
							slices.Sort(live)
							h := history[owner]
							mixedOr(e, "rv %d: Machine %s created for MachineSet %s, which already had %d live Machines for %d replicas (%s; releasing %q, receiving %q, set at rv %s); the set before it: %s",
								e.rv, obj.Name, s.Name, len(live), *s.Spec.Replicas, strings.Join(live, ", "),
								s.Annotations[machinistv1.ReleasingAnnotation], s.Annotations[machinistv1.ReceivingAnnotation], s.ResourceVersion,
								strings.Join(h[max(0, len(h)-6):], "; "))
						}
					}
				}
			}
			phase := phases.Initial
			if existed && old.Status.Phase != "" {
				phase = old.Status.Phase
			}
			if to := obj.Status.Phase; to != "" && to != phase {
				key := fmt.Sprintf("%s/%d/%s", obj.UID, e.rv, phase)
				first := !counted[key]
				counted[key] = true
				if first {
					v.transitions++
				}
				path, ok := phases.Table.Path(phase, to)
				switch {
				case !ok:
					breach("rv %d: Machine %s went from %s to %s, which no path of the lifecycle table joins", e.rv, obj.Name, phase, to)
				case !first:
				case e.gap:
					v.gapped++
				case len(path) > 1:
					// One reconcile may fire several events and write once
					// (Pending, provisioned and Ready at once).
					v.multi++
				}
				if t := obj.Status.LastTransition; !e.gap && t != nil && (!existed || old.Status.LastTransition == nil || *t != *old.Status.LastTransition) {
					if next, ok := phases.Table.Allowed(t.From, phases.Event(t.Event)); !ok || next != t.To || t.To != to {
						breach("rv %d: Machine %s in %s records the transition %s --%s--> %s, which is not a move of the lifecycle table ending there", e.rv, obj.Name, to, t.From, t.Event, t.To)
					}
				}
			}
			machines[obj.UID] = obj
		case *machinistv1.MachineSet:
			if e.typ == watch.Deleted {
				delete(sets, obj.UID)
				continue
			}
			if prev, ok := sets[obj.UID]; !ok || !equality.Semantic.DeepEqual(prev.Spec.Replicas, obj.Spec.Replicas) ||
				prev.Annotations[machinistv1.ReleasingAnnotation] != obj.Annotations[machinistv1.ReleasingAnnotation] ||
				prev.Annotations[machinistv1.ReceivingAnnotation] != obj.Annotations[machinistv1.ReceivingAnnotation] {
				history[obj.UID] = append(history[obj.UID], fmt.Sprintf("rv %d: %d replicas, releasing %q, receiving %q", e.rv,
					ptr.Deref(obj.Spec.Replicas, 1), obj.Annotations[machinistv1.ReleasingAnnotation], obj.Annotations[machinistv1.ReceivingAnnotation]))
			}
			sets[obj.UID] = obj
		case *machinistv1.MachineDeployment:
			if e.typ == watch.Deleted {
				delete(mds, obj.UID)
				continue
			}
			mds[obj.UID] = obj
		default:
			continue
		}
		for _, md := range mds {
			if md.DeletionTimestamp != nil || md.Spec.Replicas == nil {
				continue
			}
			replicas := *md.Spec.Replicas
			total, available := int32(0), int32(0)
			populated := map[types.UID]bool{}
			for _, o := range machines {
				s, ok := sets[setOf(o)]
				if !ok || !ownedBy(s, md.UID) || resumed && from.ghosts[o.UID] {
					continue
				}
				total++
				populated[s.UID] = true
				if inService(o) {
					available++
				}
			}
			strategy, err := machinedeployment.Resolve(md.Spec.Strategy, replicas)
			if err != nil {
				continue
			}
			// After a restore: armed again once the restore's Machines
			// without instances are gone (until then the rollout counts
			// them available, as their restored status says) and, for a
			// manager that ran through it, its caches are whole again.
			lied := resumed && (e.at.Before(from.mixed) || slices.ContainsFunc(slices.Collect(maps.Values(machines)), func(o *machinistv1.Machine) bool {
				return from.ghosts[o.UID] && o.DeletionTimestamp == nil
			}))
			if available >= replicas && !lied {
				armed[md.UID] = true
			}
			// The Machines a set made twice while the caches were mixed
			// go again after it: maxSurge holds once they have.
			if total <= replicas+strategy.MaxSurge && !lied {
				surged[md.UID] = false
			} else if resumed && e.at.Before(from.mixed) {
				surged[md.UID] = true
			}
			if strategy.Type == machinistv1.RecreateStrategy {
				if len(populated) > 1 {
					breach("rv %d: Recreate MachineDeployment %s had Machines of %d MachineSets at once", e.rv, md.Name, len(populated))
				}
				continue
			}
			if total > replicas+strategy.MaxSurge && surged[md.UID] {
				v.mixed++
			} else if total > replicas+strategy.MaxSurge {
				mixedOr(e, "rv %d: MachineDeployment %s had %d Machines, more than %d replicas + %d maxSurge", e.rv, md.Name, total, replicas, strategy.MaxSurge)
			}
			if armed[md.UID] && available < replicas-strategy.MaxUnavailable {
				breach("rv %d: MachineDeployment %s had %d available Machines, fewer than %d replicas - %d maxUnavailable", e.rv, md.Name, available, replicas, strategy.MaxUnavailable)
			}
		}
	}
}

// inService reports whether m counts as available against a rollout's
// maxUnavailable: Running, or out for a reboot or repair it will come back
// from, which a rollout does not cause and does not bound. A Machine being
// deleted, or not yet Running, does not count.
func inService(m *machinistv1.Machine) bool {
	if m.DeletionTimestamp != nil {
		return false
	}
	switch m.Status.Phase {
	case machinistv1.MachineRunning, machinistv1.MachineRebooting, machinistv1.MachineRepairing:
		return true
	case machinistv1.MachineDraining:
		return m.Status.Operation != nil
	}
	return false
}

// setOf is the UID of the MachineSet controlling m, or "".
func setOf(m *machinistv1.Machine) types.UID {
	if ref := metav1.GetControllerOf(m); ref != nil && ref.Kind == "MachineSet" {
		return ref.UID
	}
	return ""
}

func ownedBy(obj metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == uid
}

// bootIDs returns, per Node name, the boot IDs its versions reported, in
// order, each once.
func (m *monitor) bootIDs() map[string][]string {
	out := map[string][]string{}
	for _, e := range m.ordered() {
		n, ok := e.obj.(*corev1.Node)
		if !ok || e.typ == watch.Deleted {
			continue
		}
		id := n.Status.NodeInfo.BootID
		if ids := out[n.Name]; id != "" && (len(ids) == 0 || ids[len(ids)-1] != id) {
			out[n.Name] = append(ids, id)
		}
	}
	return out
}

// String summarises a verdict.
func (v verdict) String() string {
	mixed := ""
	if v.mixed > 0 {
		mixed = fmt.Sprintf("; %d slots filled twice or maxSurge exceeded by a manager running through a restore while its caches were mixed, e.g.%s", v.mixed,
			strings.Join(append([]string{""}, v.mixedSeen...), "\n  "))
	}
	return fmt.Sprintf("%d phase changes (%d of several moves in one write, %d across a watch gap), %d breaches%s%s", v.transitions, v.multi, v.gapped, len(v.breaches),
		strings.Join(append([]string{""}, v.breaches...), "\n  "), mixed)
}
