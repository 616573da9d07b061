// Package inventory compares the instances each provider holds (its List)
// with the Machines in the API, to find what a restore of an older backup,
// a move gone wrong or a finalizer released by hand leaves behind:
//
//   - orphans: instances made for a Machine that is gone, which no Machine
//     claims. They are paid for and seen by nothing else. Each is reported
//     at once (a Warning Event in the namespace of the Machine it was made
//     for, and machinist_orphan_instances), and deleted after a grace
//     period when one is set (off by default, as Gardener's orphan
//     collection is).
//   - ghosts: Machines whose instance is gone, which an older snapshot
//     brings back. Each is reported at once, without waiting for its
//     Node's Lease to expire (a Warning Event on the Machine, and
//     machinist_ghost_machines), and, when a MachineSet owns it, deleted
//     so that the set replaces it, once: unless more of the set's (or the
//     provider's) Machines are ghosts at once than GhostLimit allows,
//     which is what a provider that lost its books, not its instances,
//     looks like.
//
// It also looks at the Nodes of every cluster it is connected to (its own
// and the WorkloadClusters'): a Node of one of its providers' instances
// that no Machine claims is reported while its instance runs (its Machine
// is gone; its set, if any, makes another), and deleted once its instance
// is gone, as the Machine's own deletion would have.
//
// An instance that belongs to no Machine (made outside Machinist, waiting
// to be adopted through spec.providerID) is neither: it is counted, never
// deleted.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// DefaultPeriod is how often the providers are listed when the period is
// not set.
const DefaultPeriod = time.Minute

// Event reasons.
const (
	ReasonOrphanInstance = "OrphanInstance"
	ReasonOrphanDeleted  = "OrphanInstanceDeleted"
	ReasonInstanceGone   = "InstanceGone"
	ReasonGhostReplaced  = "GhostReplaced"
	ReasonGhostsHeld     = "GhostsNotReplaced"
	ReasonStrayNode      = "NodeWithoutMachine"
	ReasonStrayDeleted   = "NodeWithoutMachineDeleted"
)

// DefaultGhostLimit is the percentage of a set's (and a provider's)
// Machines that may be replaced as ghosts at once when GhostLimit is not
// set.
const DefaultGhostLimit = 50

// Checker lists every provider's instances each Period and compares them
// with the Machines. It is a manager Runnable that runs on the leader.
type Checker struct {
	// Client reads Machines and MachineClasses (the manager's cache), and
	// deletes the ghosts to be replaced.
	Client client.Client
	// APIReader reads past the cache, to confirm that an orphan's
	// Machine is really gone before its instance is deleted.
	APIReader client.Reader
	// Actuators are the providers to list; those that cannot list are
	// not checked.
	Actuators *providers.Registry
	// Recorder emits the Events; nil emits none.
	Recorder events.EventRecorder
	// Period between passes; zero means DefaultPeriod.
	Period time.Duration
	// OrphanGrace is how long an orphan is reported before it is
	// deleted; zero never deletes one. It is counted from when this
	// process first saw it: a restart starts it again, which can only
	// delay a deletion, never hasten one.
	OrphanGrace time.Duration
	// GhostLimit is the percentage of a MachineSet's Machines, and of a
	// provider's, that may be ghosts for those ghosts to be replaced (at
	// least one always may); zero means DefaultGhostLimit, negative
	// never replaces one. More ghosts than that at once is not what a
	// restore or a lost instance leaves, but a provider that lost track
	// of its instances: replacing them would run each twice.
	GhostLimit int
	// Clusters are the clusters whose Nodes are looked at, the manager's
	// own under the zero key; nil looks at none.
	Clusters interface {
		Clusters() map[types.NamespacedName]nodes.Cluster
	}
	// Metrics are set after each pass; nil sets none.
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu sync.Mutex
	// orphans maps each orphan's provider ID to when it was first seen.
	orphans map[string]time.Time
	// ghosts are the Machines reported as ghosts, by UID; held the
	// MachineSets told their ghosts are not replaced; strays the Nodes
	// reported without a Machine.
	ghosts, held reported[types.UID]
	strays       reported[stray]
	// unlisted are the providers found unable to list, said once each.
	unlisted map[string]bool
}

// Orphan is an instance made for a Machine that is gone.
type Orphan struct {
	Provider string
	providers.Listed
	// Replaced: a Machine of the owner's namespace and name exists under
	// another UID (a restore that re-created it, or a new Machine of the
	// same name). Such an orphan is reported and never deleted.
	Replaced bool
	// Since is when this process first saw it.
	Since time.Time
}

// Ghost is a Machine whose instance its provider does not hold.
type Ghost struct {
	Machine  types.NamespacedName
	Provider string

	uid        types.UID
	providerID string
	set        *metav1.OwnerReference // its controller, when a MachineSet
}

// Stray is a Node of an instance of Machinist's whose Machine is gone.
type Stray struct {
	// Cluster is its WorkloadCluster; zero for the manager's own.
	Cluster    types.NamespacedName
	Node       string
	ProviderID string
	// Deleted: its instance is gone, and the Node was deleted.
	Deleted bool
}

// reported remembers the findings reported, so that each is reported
// once while it lasts: one not found again in a pass is forgotten, and
// reported again if it comes back.
type reported[K comparable] struct {
	mu         sync.Mutex
	told, seen map[K]bool
}

// first notes that k was found in this pass and reports whether it is
// new.
func (r *reported[K]) first(k K) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[K]bool{}
	}
	if r.seen[k] {
		return false // told already, in this pass
	}
	r.seen[k] = true
	return !r.told[k]
}

// forget ends a pass: what it found is told, and nothing else.
func (r *reported[K]) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.told, r.seen = r.seen, nil
}

type stray struct {
	cluster types.NamespacedName
	node    string
}

// Report is what one pass found.
type Report struct {
	Orphans []Orphan
	// Ghosts are Machines whose instance their provider does not hold.
	Ghosts []Ghost
	// Deleted are the orphans' provider IDs deleted in this pass.
	Deleted []string
	// Replaced are the ghosts deleted in this pass for their sets to
	// replace.
	Replaced []types.NamespacedName
	// Strays are the Nodes whose Machine is gone.
	Strays []Stray
	// Unowned counts, per provider, instances that belong to no Machine.
	Unowned map[string]int
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one
// replica deletes orphans, not two.
func (c *Checker) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: a pass at once, then one per Period.
func (c *Checker) Start(ctx context.Context) error {
	period := c.Period
	if period <= 0 {
		period = DefaultPeriod
	}
	logger := log.FromContext(ctx).WithName("inventory")
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if _, err := c.Check(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "comparing the providers' instances with the Machines")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Check makes one pass: it lists every provider, then reads the Machines
// (in that order: an instance listed was made for a Machine that existed
// before the read, or is gone), reports what it finds and deletes the
// orphans whose grace is over.
func (c *Checker) Check(ctx context.Context) (Report, error) {
	now := c.now()
	rep := Report{Unowned: map[string]int{}}
	listed := map[string][]providers.Listed{}
	var errs []error
	for _, name := range c.Actuators.Names() {
		a, err := c.Actuators.Get(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		l, err := providers.List(ctx, a)
		if errors.Is(err, providers.ErrNoList) {
			c.unlistable(ctx, name)
			continue
		}
		if err != nil {
			// Nothing is concluded of a provider that did not answer: an
			// empty list would make every Machine a ghost.
			errs = append(errs, fmt.Errorf("listing the instances of provider %s: %w", name, err))
			continue
		}
		listed[name] = l
	}
	var machines machinistv1.MachineList
	if err := c.Client.List(ctx, &machines); err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	uids := map[types.UID]bool{}
	claimed := map[string]bool{}
	byName := map[types.NamespacedName]types.UID{}
	for i := range machines.Items {
		m := &machines.Items[i]
		uids[m.UID] = true
		byName[client.ObjectKeyFromObject(m)] = m.UID
		for _, id := range []string{m.Status.ProviderID, m.Spec.ProviderID} {
			if id != "" {
				claimed[id] = true
			}
		}
	}

	c.mu.Lock()
	if c.orphans == nil {
		c.orphans, c.unlisted = map[string]time.Time{}, map[string]bool{}
	}
	c.mu.Unlock()
	current := map[string]bool{}
	for name, instances := range listed {
		for _, in := range instances {
			switch {
			case claimed[in.ProviderID] || uids[in.Owner.UID]:
			case in.Owner.IsZero():
				rep.Unowned[name]++
			default:
				o, err := c.orphan(ctx, name, in, byName, now)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if o != nil {
					current[in.ProviderID] = true
					rep.Orphans = append(rep.Orphans, *o)
				}
			}
		}
	}
	c.mu.Lock()
	for id := range c.orphans {
		if !current[id] {
			delete(c.orphans, id) // claimed, adopted or gone since
		}
	}
	c.mu.Unlock()

	ghosts, err := c.findGhosts(ctx, machines.Items, listed)
	errs = append(errs, err)
	rep.Ghosts = ghosts
	replaced, err := c.replace(ctx, ghosts, machines.Items, listed)
	errs = append(errs, err)
	rep.Replaced = replaced
	strays, err := c.findStrays(ctx, machines.Items, listed)
	errs = append(errs, err)
	rep.Strays = strays

	if c.OrphanGrace > 0 {
		for _, o := range rep.Orphans {
			if o.Replaced || now.Sub(o.Since) < c.OrphanGrace {
				continue
			}
			deleted, err := c.collect(ctx, o)
			errs = append(errs, err)
			if deleted {
				rep.Deleted = append(rep.Deleted, o.ProviderID)
			}
		}
	}
	c.Metrics.set(c.Actuators.Names(), listed, rep)
	return rep, errors.Join(errs...)
}

// orphan confirms, by Exists, that an instance whose Machine is gone is
// still there (a Machine deleted between the List and the read of the
// Machines took its instance with it), and reports it the first time.
func (c *Checker) orphan(ctx context.Context, provider string, in providers.Listed, byName map[types.NamespacedName]types.UID, now time.Time) (*Orphan, error) {
	a, err := c.Actuators.Get(provider)
	if err != nil {
		return nil, err
	}
	exists, err := a.Exists(ctx, in.ProviderID)
	if err != nil {
		return nil, fmt.Errorf("asking provider %s whether %s exists: %w", provider, in.ProviderID, err)
	}
	if !exists {
		return nil, nil
	}
	owner := types.NamespacedName{Namespace: in.Owner.Namespace, Name: in.Owner.Name}
	_, replaced := byName[owner]
	c.mu.Lock()
	since, seen := c.orphans[in.ProviderID]
	if !seen {
		since = now
		c.orphans[in.ProviderID] = now
	}
	c.mu.Unlock()
	o := &Orphan{Provider: provider, Listed: in, Replaced: replaced, Since: since}
	if !seen {
		what := "no Machine claims it"
		if replaced {
			what = "a Machine of the same name exists under another UID, and is not given it"
		}
		c.event(gone(in.Owner), corev1.EventTypeWarning, ReasonOrphanInstance, "Inventory",
			"instance %s of provider %s was made for this Machine (UID %s), which is gone; %s. %s",
			in.ProviderID, provider, in.Owner.UID, what, c.graceNote(replaced))
	}
	return o, nil
}

func (c *Checker) graceNote(replaced bool) string {
	switch {
	case replaced:
		return "It is not deleted: delete it by hand once it is not wanted."
	case c.OrphanGrace > 0:
		return fmt.Sprintf("It is deleted %s after it was first seen unless a Machine claims it.", c.OrphanGrace)
	}
	return "Orphan deletion is off (--orphan-deletion-grace): delete it by hand, or give a Machine its spec.providerID."
}

// collect deletes an orphan whose grace is over, once the API itself (not
// the cache) confirms that its Machine is gone.
func (c *Checker) collect(ctx context.Context, o Orphan) (bool, error) {
	m := &machinistv1.Machine{}
	err := c.APIReader.Get(ctx, types.NamespacedName{Namespace: o.Owner.Namespace, Name: o.Owner.Name}, m)
	switch {
	case err == nil:
		// A Machine of that name is back (its UID may even be the
		// owner's: the cache was late). Not this pass.
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, err
	}
	a, err := c.Actuators.Get(o.Provider)
	if err != nil {
		return false, err
	}
	if err := a.Delete(ctx, o.ProviderID); err != nil {
		return false, fmt.Errorf("deleting orphan %s of provider %s: %w", o.ProviderID, o.Provider, err)
	}
	c.mu.Lock()
	delete(c.orphans, o.ProviderID)
	c.mu.Unlock()
	c.Metrics.deleted(o.Provider)
	c.event(gone(o.Owner), corev1.EventTypeNormal, ReasonOrphanDeleted, "Inventory",
		"deleted instance %s of provider %s, an orphan for %s", o.ProviderID, o.Provider, c.OrphanGrace)
	return true, nil
}

// ghostPhases are the phases in which a Machine has an instance that must
// be there: not before it is made, not while it is being deleted.
var ghostPhases = []machinistv1.MachinePhase{
	machinistv1.MachineRunning, machinistv1.MachineDraining, machinistv1.MachineRebooting,
	machinistv1.MachineRepairing, machinistv1.MachineUpdating,
}

// findGhosts reports the Machines whose provider listed its instances
// without theirs, confirmed by Exists.
func (c *Checker) findGhosts(ctx context.Context, machines []machinistv1.Machine, listed map[string][]providers.Listed) ([]Ghost, error) {
	held, owners := map[string]bool{}, map[types.UID]bool{}
	for _, instances := range listed {
		for _, in := range instances {
			held[in.ProviderID] = true
			owners[in.Owner.UID] = true
		}
	}
	var ghosts []Ghost
	var errs []error
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() || m.Status.ProviderID == "" || held[m.Status.ProviderID] || !slices.Contains(ghostPhases, m.Status.Phase) {
			continue
		}
		if owners[m.UID] {
			// An instance made for it is listed under another ID: a
			// provider that replaces an instance to repair it, its new
			// ID not yet in the Machine's status.
			continue
		}
		class := &machinistv1.MachineClass{}
		if err := c.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClassRef.Name}, class); err != nil {
			continue // its provider is not known, so nothing is concluded
		}
		if _, ok := listed[class.Spec.Provider]; !ok {
			continue
		}
		a, err := c.Actuators.Get(class.Spec.Provider)
		if err != nil {
			continue
		}
		exists, err := a.Exists(ctx, m.Status.ProviderID)
		if err != nil {
			errs = append(errs, fmt.Errorf("asking provider %s whether %s exists: %w", class.Spec.Provider, m.Status.ProviderID, err))
			continue
		}
		if exists {
			continue // made since the List
		}
		g := Ghost{Machine: client.ObjectKeyFromObject(m), Provider: class.Spec.Provider, uid: m.UID, providerID: m.Status.ProviderID}
		if ref := metav1.GetControllerOf(m); ref != nil && ref.Kind == "MachineSet" && ref.APIVersion == machinistv1.GroupVersion.String() {
			g.set = ref
		}
		ghosts = append(ghosts, g)
		if c.ghosts.first(m.UID) {
			c.event(m, corev1.EventTypeWarning, ReasonInstanceGone, "Inventory",
				"provider %s does not hold instance %s any more: the Machine is %s, but nothing runs behind it", class.Spec.Provider, m.Status.ProviderID, m.Status.Phase)
		}
	}
	c.ghosts.forget()
	return ghosts, errors.Join(errs...)
}

// replace deletes the ghosts a MachineSet owns, for the set to replace
// each once: the deletion is of the Machine read from the API itself,
// still a ghost, under its UID and resourceVersion, so that a Machine
// changed or re-created since is left alone, and a deleted Machine is no
// ghost in a later pass. It replaces none of a set or a provider with
// more ghosts than GhostLimit allows, nor a paused Machine or set.
func (c *Checker) replace(ctx context.Context, ghosts []Ghost, machines []machinistv1.Machine, listed map[string][]providers.Listed) ([]types.NamespacedName, error) {
	limit := c.GhostLimit
	if limit == 0 {
		limit = DefaultGhostLimit
	}
	bySet, byProvider := map[types.UID]int{}, map[string]int{}
	for _, g := range ghosts {
		byProvider[g.Provider]++
		if g.set != nil {
			bySet[g.set.UID]++
		}
	}
	members := map[types.UID]int{}
	for i := range machines {
		if ref := metav1.GetControllerOf(&machines[i]); ref != nil && machines[i].DeletionTimestamp.IsZero() {
			members[ref.UID]++
		}
	}
	var replaced []types.NamespacedName
	var errs []error
	for _, g := range ghosts {
		if g.set == nil || limit < 0 {
			continue
		}
		if n := bySet[g.set.UID]; n > allowed(limit, members[g.set.UID]) {
			c.holding(g, fmt.Sprintf("%d of its %d Machines are ghosts at once", n, members[g.set.UID]), limit)
			continue
		}
		// The provider holds what it listed, and held nothing for its
		// ghosts.
		if n := byProvider[g.Provider]; n > allowed(limit, len(listed[g.Provider])+n) {
			c.holding(g, fmt.Sprintf("%d of provider %s's %d Machines are ghosts at once", n, g.Provider, len(listed[g.Provider])+n), limit)
			continue
		}
		done, err := c.replaceOne(ctx, g)
		errs = append(errs, err)
		if done {
			replaced = append(replaced, g.Machine)
		}
	}
	c.held.forget()
	return replaced, errors.Join(errs...)
}

// allowed is how many ghosts of n Machines may be replaced at once: limit
// percent of them rounded up, as a MachineHealthCheck's maxUnhealthy is,
// and at least one.
func allowed(limit, n int) int {
	return max(1, (n*limit+99)/100)
}

// holding tells g's set, once while it lasts, that its ghosts are not
// replaced and why.
func (c *Checker) holding(g Ghost, why string, limit int) {
	if !c.held.first(g.set.UID) || c.Recorder == nil {
		return
	}
	set := &machinistv1.MachineSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: machinistv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: metav1.ObjectMeta{Namespace: g.Machine.Namespace, Name: g.set.Name, UID: g.set.UID},
	}
	c.Recorder.Eventf(set, nil, corev1.EventTypeWarning, ReasonGhostsHeld, "Inventory",
		"its ghost Machines (whose instances provider %s does not hold) are not replaced: %s, more than %d%% (--ghost-replacement-limit), which looks like a provider that lost track of its instances rather than instances lost. Check the provider; delete the Machines by hand to have them replaced",
		g.Provider, why, limit)
}

// replaceOne deletes ghost g, read again from the API, if it still is
// one and neither it nor its set is paused.
func (c *Checker) replaceOne(ctx context.Context, g Ghost) (bool, error) {
	m := &machinistv1.Machine{}
	if err := c.APIReader.Get(ctx, g.Machine, m); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if m.UID != g.uid || !m.DeletionTimestamp.IsZero() || m.Status.ProviderID != g.providerID || !slices.Contains(ghostPhases, m.Status.Phase) {
		return false, nil
	}
	if p, err := pause.Machine(ctx, c.Client, m); err != nil || p.Paused() {
		return false, err
	}
	set := &machinistv1.MachineSet{}
	if err := c.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: g.set.Name}, set); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if set.UID != g.set.UID || !set.DeletionTimestamp.IsZero() || pause.Of(set, "MachineSet").Paused() {
		return false, nil
	}
	rv := m.ResourceVersion
	if err := c.Client.Delete(ctx, m, client.Preconditions{UID: &m.UID, ResourceVersion: &rv}); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return false, nil // changed since: the next pass looks again
		}
		return false, fmt.Errorf("deleting ghost Machine %s: %w", g.Machine, err)
	}
	c.Metrics.replaced(g.Provider)
	c.event(m, corev1.EventTypeWarning, ReasonGhostReplaced, "Inventory",
		"deleted: provider %s does not hold its instance %s any more; MachineSet %s replaces it", g.Provider, g.providerID, set.Name)
	return true, nil
}

// findStrays looks at the Nodes of every connected cluster for those of
// an instance of a provider listed this pass (by its providerID) that no
// Machine claims: reported while the instance is listed, deleted once
// Exists confirms it is gone. A paused WorkloadCluster's are left alone.
func (c *Checker) findStrays(ctx context.Context, machines []machinistv1.Machine, listed map[string][]providers.Listed) ([]Stray, error) {
	if c.Clusters == nil {
		return nil, nil
	}
	claimed, live := map[string]bool{}, map[types.UID]bool{}
	for i := range machines {
		live[machines[i].UID] = true
		for _, id := range []string{machines[i].Status.ProviderID, machines[i].Spec.ProviderID} {
			if id != "" {
				claimed[id] = true
			}
		}
	}
	held := map[string]bool{}
	for _, instances := range listed {
		for _, in := range instances {
			held[in.ProviderID] = true
			if live[in.Owner.UID] {
				claimed[in.ProviderID] = true // its Machine has not recorded it yet
			}
		}
	}
	var strays []Stray
	var errs []error
	for key, cluster := range c.Clusters.Clusters() {
		if key.Name != "" {
			wc := &machinistv1.WorkloadCluster{}
			if err := c.Client.Get(ctx, key, wc); err != nil || pause.Annotated(wc) {
				continue
			}
		}
		all, err := cluster.Nodes(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the Nodes of cluster %s: %w", clusterName(key), err))
			continue
		}
		for i := range all {
			node := &all[i]
			id := node.Spec.ProviderID
			provider, _, _ := strings.Cut(id, ":")
			if id == "" || claimed[id] {
				continue
			}
			if _, ok := listed[provider]; !ok {
				continue // not a provider of ours, or not listed this pass
			}
			ns, _, _, err := providers.ParseProviderID(provider, id)
			if err != nil || key.Name != "" && ns != key.Namespace {
				// Not an instance Machinist made, or one a WorkloadCluster's
				// Machines could not have made: a Node naming another
				// namespace's instance is not its business, nor this
				// namespace's Events.
				continue
			}
			s := Stray{Cluster: key, Node: node.Name, ProviderID: id}
			if !held[id] {
				deleted, err := c.deleteStray(ctx, provider, cluster, node)
				errs = append(errs, err)
				if !deleted {
					continue
				}
				s.Deleted = true
				c.strayEvent(key, node, corev1.EventTypeNormal, ReasonStrayDeleted,
					"deleted Node %s: no Machine claims it, and provider %s does not hold its instance %s", node.Name, provider, id)
			} else {
				if c.strays.first(stray{key, node.Name}) {
					c.strayEvent(key, node, corev1.EventTypeWarning, ReasonStrayNode,
						"Node %s has no Machine: its instance %s of provider %s runs, but the Machine it was made for is gone. It is deleted once its instance is; delete the instance, or give a Machine its spec.providerID", node.Name, id, provider)
				}
			}
			strays = append(strays, s)
		}
	}
	c.strays.forget()
	return strays, errors.Join(errs...)
}

// deleteStray deletes node, once its provider confirms its instance is
// gone (not made since the List).
func (c *Checker) deleteStray(ctx context.Context, provider string, cluster nodes.Cluster, node *corev1.Node) (bool, error) {
	a, err := c.Actuators.Get(provider)
	if err != nil {
		return false, err
	}
	exists, err := a.Exists(ctx, node.Spec.ProviderID)
	if err != nil || exists {
		return false, err
	}
	if err := cluster.Delete(ctx, node); err != nil {
		return false, fmt.Errorf("deleting Node %s, whose Machine and instance are gone: %w", node.Name, err)
	}
	return true, nil
}

// strayEvent records an Event about a Node without a Machine: on its
// WorkloadCluster, or on the Node itself in the manager's own cluster.
func (c *Checker) strayEvent(key types.NamespacedName, node *corev1.Node, kind, reason, format string, args ...any) {
	if c.Recorder == nil {
		return
	}
	var regarding k8sruntime.Object = &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID},
	}
	if key.Name != "" {
		regarding = &machinistv1.WorkloadCluster{
			TypeMeta:   metav1.TypeMeta{APIVersion: machinistv1.GroupVersion.String(), Kind: "WorkloadCluster"},
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		}
	}
	c.Recorder.Eventf(regarding, nil, kind, reason, "Inventory", format, args...)
}

func clusterName(key types.NamespacedName) string {
	if key.Name == "" {
		return "(the management cluster)"
	}
	return key.String()
}

func (c *Checker) unlistable(ctx context.Context, name string) {
	c.mu.Lock()
	said := c.unlisted[name]
	if c.unlisted == nil {
		c.unlisted = map[string]bool{}
	}
	c.unlisted[name] = true
	c.mu.Unlock()
	if !said {
		log.FromContext(ctx).WithName("inventory").Info("provider cannot list its instances: its orphans and ghosts are not looked for", "provider", name)
	}
}

// gone is the Machine an orphan was made for, as an Event's subject: the
// Event lands in its namespace, where `kubectl get events` shows it to
// those who may read that namespace, and to no one else.
func gone(o providers.Owner) *machinistv1.Machine {
	return &machinistv1.Machine{
		TypeMeta:   metav1.TypeMeta{APIVersion: machinistv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name, UID: o.UID},
	}
}

func (c *Checker) event(obj *machinistv1.Machine, kind, reason, action, format string, args ...any) {
	if c.Recorder != nil {
		c.Recorder.Eventf(obj, nil, kind, reason, action, format, args...)
	}
}

func (c *Checker) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Metrics are the inventory's gauges and counter.
type Metrics struct {
	orphans, ghosts, unowned  *prometheus.GaugeVec
	strays                    *prometheus.GaugeVec
	collected, ghostsReplaced *prometheus.CounterVec
}

// NewMetrics makes the metrics; Register them.
func NewMetrics() *Metrics {
	return &Metrics{
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "machinist_orphan_instances",
			Help: "Instances a provider holds that were made for a Machine that is gone, as of the last inventory pass."}, []string{"provider"}),
		ghosts: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "machinist_ghost_machines",
			Help: "Machines whose instance their provider no longer holds, as of the last inventory pass."}, []string{"provider"}),
		unowned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "machinist_unowned_instances",
			Help: "Instances a provider holds that belong to no Machine (made outside Machinist), as of the last inventory pass."}, []string{"provider"}),
		collected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machinist_orphan_instances_deleted_total",
			Help: "Orphan instances deleted after --orphan-deletion-grace."}, []string{"provider"}),
		strays: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "machinist_nodes_without_machine",
			Help: "Nodes of an instance that runs but whose Machine is gone, by cluster (a WorkloadCluster's namespace/name, or management), as of the last inventory pass."}, []string{"cluster"}),
		ghostsReplaced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machinist_ghost_machines_replaced_total",
			Help: "Ghost Machines (whose instance is gone) deleted for their MachineSets to replace."}, []string{"provider"}),
	}
}

// Register registers the metrics with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(m.orphans), reg.Register(m.ghosts), reg.Register(m.unowned), reg.Register(m.collected), reg.Register(m.ghostsReplaced), reg.Register(m.strays))
}

func (m *Metrics) set(names []string, listed map[string][]providers.Listed, rep Report) {
	if m == nil {
		return
	}
	orphans, ghosts := map[string]int{}, map[string]int{}
	for _, o := range rep.Orphans {
		if !slices.Contains(rep.Deleted, o.ProviderID) {
			orphans[o.Provider]++
		}
	}
	for _, g := range rep.Ghosts {
		ghosts[g.Provider]++
	}
	m.strays.Reset()
	// Served while there are none, so that the alert's series is there.
	m.strays.WithLabelValues("management").Set(0)
	for _, s := range rep.Strays {
		if !s.Deleted {
			name := "management"
			if s.Cluster.Name != "" {
				name = s.Cluster.String()
			}
			m.strays.WithLabelValues(name).Inc()
		}
	}
	for _, name := range names {
		if _, ok := listed[name]; !ok {
			continue // not listed this pass: the last values stand
		}
		m.orphans.WithLabelValues(name).Set(float64(orphans[name]))
		m.unowned.WithLabelValues(name).Set(float64(rep.Unowned[name]))
		m.ghosts.WithLabelValues(name).Set(float64(ghosts[name]))
	}
}

func (m *Metrics) replaced(provider string) {
	if m != nil {
		m.ghostsReplaced.WithLabelValues(provider).Inc()
	}
}

func (m *Metrics) deleted(provider string) {
	if m != nil {
		m.collected.WithLabelValues(provider).Inc()
	}
}
