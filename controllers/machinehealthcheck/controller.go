package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/requeue"
	"github.com/machinist-dev/machinist/internal/stale"
	"github.com/machinist-dev/machinist/internal/wake"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/nodes"
)

// Reconciler is the MachineHealthCheck controller. One reconcile of a
// health check judges all its Machines, decides which rungs start, and
// writes each Machine whose remediation changed once, then the check's
// status if its counts changed.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Nodes is where a Machine's Node is read: the same seam the Machine
	// controller reaches every Node through.
	Nodes nodes.Clusters
	// Connections announces workload clusters as the manager connects to
	// them, so that their Nodes are watched; nil when there are none.
	Connections nodes.Connections
	// APIReader reads past the cache: the disruption budgets a Replace
	// rung asks before it deletes a Machine. Nil asks none.
	APIReader client.Reader
	// Recorder emits an Event per rung started and ended.
	Recorder events.EventRecorder
	// Metrics counts remediations; nil records none.
	Metrics *Metrics
	// NodeGrace is how long kubelets are given to report after the manager
	// starts or the API server comes back, before a Node condition counts
	// against a Machine: a Lease period. Zero means 40s, the kubelet's.
	NodeGrace time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Calendar is the clock the disruption budgets are asked on: their
	// windows open and close on it. Nil means time.Now.
	Calendar func() time.Time

	// writes and checkWrites keep a pass from acting on a cached Machine,
	// or health check, older than its own last write to it.
	writes      stale.Writes
	checkWrites stale.Writes
	mu          sync.Mutex
	trusted     time.Time // start of the manager, or the last watch error since
}

// RequestedBy is how a health check signs the operations it requests.
func RequestedBy(name string) string { return "machinehealthcheck/" + name }

// SetupWithManager registers the controller and its watches.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if err := index.Register(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	r.sawAPI(r.now())
	c, err := ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.MachineHealthCheck{}, builder.WithPredicates(wake.OnChangeByOthers())).
		Watches(&machinistv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.checksForMachine),
			builder.WithPredicates(machineChanged())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.checksForNode),
			builder.WithPredicates(nodeChanged())).
		// A cluster that went away leaves its Nodes as they were last
		// seen, with no event to wake a check: its reachability does.
		Watches(&machinistv1.WorkloadCluster{}, handler.EnqueueRequestsFromMapFunc(r.checksInNamespace),
			builder.WithPredicates(predicate.Or[client.Object](wake.OnReachabilityChange(), pause.Toggled()))).
		WithOptions(opts).
		Named("machinehealthcheck").
		Build(r)
	if err != nil {
		return err
	}
	if r.Connections != nil {
		// Nodes are judged in each Machine's own cluster.
		r.Connections.OnConnect(func(_ context.Context, _ types.NamespacedName, nodeCache cache.Cache) error {
			return c.Watch(source.Kind[client.Object](nodeCache, &corev1.Node{},
				handler.EnqueueRequestsFromMapFunc(r.checksForNode), nodeChanged()))
		})
	}
	return nil
}

// WatchError is a cache's watch error handler: a watch that failed means
// the API server may have been out of reach, and the Node conditions it
// shows after that may be stale until the kubelets have reported again.
func (r *Reconciler) WatchError(ctx context.Context, rf *toolscache.Reflector, err error) {
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		r.sawAPI(r.now())
	}
	toolscache.DefaultWatchErrorHandler(ctx, rf, err)
}

func (r *Reconciler) sawAPI(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.After(r.trusted) {
		r.trusted = t
	}
}

func (r *Reconciler) trust() trust {
	r.mu.Lock()
	defer r.mu.Unlock()
	grace := r.NodeGrace
	if grace <= 0 {
		grace = 40 * time.Second
	}
	return trust{Since: r.trusted, Grace: grace}
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// pass is one reconcile of one health check.
type pass struct {
	hc      *machinistv1.MachineHealthCheck
	ladder  []machinistv1.Rung
	now     time.Time
	recheck time.Time
	// slots is how many more remediations may start in this pass.
	slots int
	// held says why no remediation may start ("" when they may).
	held string
	// down is, by WorkloadCluster name, why a cluster is found down
	// (nil: it is not), for this pass.
	down map[string]*nodes.NotConnectedError
	// allows asks the disruption budgets whether a remediation of a
	// Machine may start now, recording nothing: nil when they allow it.
	allows func(*machinistv1.Machine) (*disruption.Refusal, error)
}

func (p *pass) after(t time.Time) { p.recheck = earliest(p.recheck, t) }

// target is one selected Machine and what this pass decides for it.
type target struct {
	m      *machinistv1.Machine
	before *machinistv1.MachineStatus
	node   *corev1.Node
	// unseen: the Machine's cluster cannot be reached (or is being
	// connected), so its Node is not judged.
	unseen *nodes.NotConnectedError
	// ambiguous: several Nodes claim the Machine's providerID, so none is
	// judged its Node (nodes.API.Node).
	ambiguous bool
	v         verdict
	fsm       *ladder
	notes     []note
	// counts and healed are the metrics of this pass, recorded once the
	// Machine is written: a pass that fails to write is done again.
	counts []count
	healed time.Duration
}

type count struct {
	action  machinistv1.RemediationAction
	outcome string
}

func (t *target) count(a machinistv1.RemediationAction, outcome string) {
	t.counts = append(t.counts, count{a, outcome})
}

type note struct{ kind, reason, message string }

func (t *target) note(kind, reason, format string, args ...any) {
	t.notes = append(t.notes, note{kind, reason, fmt.Sprintf(format, args...)})
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	hc := &machinistv1.MachineHealthCheck{}
	if err := r.Client.Get(ctx, req.NamespacedName, hc); err != nil {
		if apierrors.IsNotFound(err) {
			r.checkWrites.Forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !hc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	if r.checkWrites.Stale(ctx, r.APIReader, hc) {
		return reconcile.Result{RequeueAfter: stale.Recheck}, nil
	}
	if p := pause.Of(hc, "MachineHealthCheck"); p.Paused() {
		// Neither judged nor remediated, and its counts stay as they were.
		st := *hc.Status.DeepCopy()
		if !pause.Mark(&st.Conditions, p) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, r.writeStatus(ctx, hc, st, nil)
	}
	selector, err := metav1.LabelSelectorAsSelector(hc.Spec.Selector.AsMeta())
	if err != nil {
		// CEL cannot check every selector; say so rather than retry.
		return reconcile.Result{}, r.writeStatus(ctx, hc, hc.Status, invalid(hc, err))
	}
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(hc.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return reconcile.Result{}, err
	}
	p := &pass{hc: hc, ladder: hc.Spec.Remediation.Ladder, now: r.now()}
	p.allows = func(m *machinistv1.Machine) (*disruption.Refusal, error) { return r.allows(ctx, hc, m) }
	checks, tr := checksOf(&hc.Spec), r.trust()
	var targets []*target
	for i := range list.Items {
		m := &list.Items[i]
		if r.writes.Stale(ctx, r.APIReader, m) {
			return reconcile.Result{RequeueAfter: stale.Recheck}, nil
		}
		if rem := m.Status.Remediation; rem != nil && rem.HealthCheck != hc.Name && r.exists(ctx, hc.Namespace, rem.HealthCheck) {
			// Another health check selects it too and got there first.
			continue
		}
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if pz, err := pause.Machine(ctx, r.Client, m); err != nil {
			return reconcile.Result{}, err
		} else if pz.Paused() {
			// Not a target while paused: neither judged, counted nor
			// remediated, and a rung in progress waits for the resume.
			continue
		}
		t := &target{m: m, before: m.Status.DeepCopy(), fsm: newFSM(m)}
		if m.Status.Phase == machinistv1.MachineRunning {
			cluster, err := r.Nodes.For(ctx, m)
			if nc, ok := nodes.NotConnected(err); ok {
				// Its Node cannot be seen: nothing is known of its
				// health, and nothing is held against it.
				cluster, t.unseen = nil, nc
				// The WorkloadCluster says whether, why and since when the
				// cluster was found down, as it does for every controller:
				// a manager that has just started, connecting or failing
				// to, neither calls it reachable for a moment nor rewrites
				// its Machines' messages.
				if down, err := r.down(ctx, p, m); err != nil {
					return reconcile.Result{}, err
				} else if down != nil {
					t.unseen = down
				}
			} else if err != nil {
				return reconcile.Result{}, err
			}
			if cluster != nil && m.Spec.ClusterName != "" {
				// Connected, but found down since: the cache shows its
				// Nodes as they were last seen, which says nothing of
				// them now.
				if t.unseen, err = r.down(ctx, p, m); err != nil {
					return reconcile.Result{}, err
				}
				if t.unseen != nil {
					cluster = nil
				}
			}
			if cluster != nil {
				if t.node, err = cluster.Node(ctx, m.Status.ProviderID); err != nil {
					if _, dup := errors.AsType[*nodes.DuplicateNodesError](err); !dup {
						return reconcile.Result{}, err
					}
					// Judged by neither: a Node that claims the Machine's
					// instance may be an impostor's, reporting whatever
					// would have the Machine remediated.
					t.ambiguous = true
				}
			}
		}
		if operation.InFlight(m.Status.Operation) || t.unseen != nil || t.ambiguous {
			// Not judged until the operation ends: a Machine whose
			// reboot is recorded but not yet begun still looks as it did,
			// and a verdict written now would only race the Machine
			// controller's own write.
			t.v = verdict{}
		} else {
			t.v = judge(checks, m, t.node, p.now, tr)
		}
		if !t.v.recheck.IsZero() {
			p.after(t.v.recheck)
		}
		targets = append(targets, t)
	}
	st := machinistv1.MachineHealthCheckStatus{ExpectedMachines: int32(len(targets)), ObservedGeneration: hc.Generation}
	for _, t := range targets {
		switch {
		case t.v.known && t.v.healthy:
			st.HealthyMachines++
		case t.v.known:
			st.UnhealthyMachines++
		case t.m.Status.Remediation != nil && t.m.Status.Remediation.Phase != machinistv1.RemediationHealthy &&
			t.m.Status.Remediation.Phase != machinistv1.RemediationRecovered:
			st.UnhealthyMachines++
		default:
			st.HealthyMachines++
		}
	}
	maxUnhealthy := scaled(hc.Spec.MaxUnhealthy, "100%", len(targets), false)
	maxInFlight := max(scaled(hc.Spec.Remediation.MaxInFlight, "1", len(targets), true), 1)
	if int(st.UnhealthyMachines) > maxUnhealthy {
		p.held = fmt.Sprintf("%d of %d Machines are unhealthy, more than maxUnhealthy (%s) allows: no remediation starts until some recover",
			st.UnhealthyMachines, len(targets), hc.Spec.MaxUnhealthy.String())
	}

	// Rungs in progress first: one that ends frees its slot for a Machine
	// waiting in this same pass. The longest unhealthy go first.
	slices.SortStableFunc(targets, func(a, b *target) int { return unhealthySince(a.m).Compare(unhealthySince(b.m)) })
	var climbing, waiting []*target
	for _, t := range targets {
		if !mine(t.m, hc) || !remediating(t.m.Status.Remediation.Phase) {
			waiting = append(waiting, t)
			continue
		}
		climbing = append(climbing, t)
		if err := r.step(p, t); err != nil {
			return reconcile.Result{}, err
		}
	}
	inFlight := r.inFlight(hc, list.Items, targets)
	if p.held == "" {
		p.slots = max(maxInFlight-inFlight, 0)
	}
	for _, t := range waiting {
		if err := r.step(p, t); err != nil {
			return reconcile.Result{}, err
		}
	}

	// Written in the order decided: a rung that ended is stored before
	// the one that took its slot starts, so that no one watching ever
	// sees more than maxInFlight at once; and if it could not be stored,
	// the new one does not start either.
	var errs []error
	for _, t := range climbing {
		if err := r.write(ctx, p, t); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return requeue.Expected(reconcile.Result{}, errors.Join(errs...))
	}
	for _, t := range waiting {
		if err := r.write(ctx, p, t); err != nil {
			errs = append(errs, err)
		}
	}
	inFlight = r.inFlight(hc, list.Items, targets)
	st.RemediationsInFlight = int32(inFlight)
	if p.held == "" {
		st.RemediationsAllowed = int32(max(maxInFlight-inFlight, 0))
	}
	st.Conditions = slices.Clone(hc.Status.Conditions)
	pause.Mark(&st.Conditions, pause.Pause{})
	r.setAllowed(hc, &st, p.held)
	r.setReachable(hc, &st, targets)
	if err := r.writeStatus(ctx, hc, st, nil); err != nil {
		errs = append(errs, err)
	}
	res := reconcile.Result{}
	if !p.recheck.IsZero() {
		// A second late rather than early: the verdict is due at recheck.
		res.RequeueAfter = p.recheck.Sub(r.now()) + time.Second
	}
	return requeue.Expected(res, errors.Join(errs...))
}

// inFlight counts the Machines of hc on a rung: the targets as this pass
// left them, and those being deleted (replaced, or deleted by someone
// while on a rung) until they are gone.
func (r *Reconciler) inFlight(hc *machinistv1.MachineHealthCheck, all []machinistv1.Machine, targets []*target) int {
	n := 0
	for _, t := range targets {
		if mine(t.m, hc) && remediating(t.m.Status.Remediation.Phase) {
			n++
		}
	}
	for i := range all {
		if m := &all[i]; !m.DeletionTimestamp.IsZero() && mine(m, hc) && remediating(m.Status.Remediation.Phase) {
			n++
		}
	}
	return n
}

// write stores what the pass decided for one Machine, then deletes it if
// it is to be replaced: the rung is on record before the Machine goes.
func (r *Reconciler) write(ctx context.Context, p *pass, t *target) error {
	m := t.m
	// A Replacing Machine is deleted after its rung is stored, and again
	// by a later pass if the manager stopped between the two; the budgets
	// are asked first, so that a hold is stored (and said) once.
	replace := mine(m, p.hc) && m.Status.Remediation.Phase == machinistv1.RemediationReplacing
	held := false
	if replace {
		var err error
		if held, err = r.holdReplace(ctx, p, t); err != nil {
			return err
		}
	}
	setCondition(m, t.v, p)
	setUnseen(m, t.unseen, p)
	setRemediating(m)
	m.Status.Fit()
	if !equality.Semantic.DeepEqual(t.before, &m.Status) {
		if err := r.Client.Status().Update(ctx, m); err != nil {
			return err
		}
		r.writes.Wrote(m)
	}
	for _, n := range t.notes {
		if r.Recorder != nil {
			r.Recorder.Eventf(m, p.hc, n.kind, n.reason, "Remediate", "%s", n.message)
		}
	}
	if r.Metrics != nil {
		r.Metrics.record(t.counts, t.healed)
	}
	if replace && !held {
		uid := m.UID
		if err := r.Client.Delete(ctx, m, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return err
		}
		r.writes.Forget(client.ObjectKeyFromObject(m))
	}
	return nil
}

// holdReplace asks the disruption budgets before a Replace rung deletes
// its Machine (reason Remediation), and records the disruption when they
// admit it. A Machine that is down passes any budget: a dead machine is
// not a disruption. The first rung was asked before it started (see
// start), so a hold here is a later rung's, or a race with another actor:
// the rung stays Replacing and says why in its message, with one Event
// when the hold begins, not one per look.
func (r *Reconciler) holdReplace(ctx context.Context, p *pass, t *target) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	m, rem := t.m, t.m.Status.Remediation
	store := disruption.Cached(r.APIReader, r.Client)
	req := disruption.Request{Machine: m, Reason: machinistv1.DisruptionRemediation, By: RequestedBy(p.hc.Name)}
	err := store.Admit(ctx, req, disruption.At(r.Calendar))
	refusal, refused := disruption.AsRefusal(err)
	if !refused {
		return false, err
	}
	if !heldBy(rem.Message, refusal) {
		t.note(corev1.EventTypeNormal, machinistv1.ReasonDisruptionHeld, "not replacing Machine %s yet: %s", m.Name, refusal.Message)
	}
	rem.Message = fmt.Sprintf("rung %d of %d (%s) waits: %s", rem.Rung+1, len(p.ladder), rem.Action, refusal.Message)
	p.after(p.now.Add(refusal.RetryAfter))
	return true, nil
}

// allows asks the disruption budgets, recording nothing, whether a
// remediation of m may start now: nil when they allow it.
func (r *Reconciler) allows(ctx context.Context, hc *machinistv1.MachineHealthCheck, m *machinistv1.Machine) (*disruption.Refusal, error) {
	if r.APIReader == nil {
		return nil, nil
	}
	store := disruption.Cached(r.APIReader, r.Client)
	req := disruption.Request{Machine: m, Reason: machinistv1.DisruptionRemediation, By: RequestedBy(hc.Name)}
	err := store.Allows(ctx, req, disruption.At(r.Calendar))
	if refusal, ok := disruption.AsRefusal(err); ok {
		return refusal, nil
	}
	return nil, err
}

// setCondition keeps the Machine's HealthCheckSucceeded condition in step
// with the verdict; an unknown verdict leaves it as it was.
func setCondition(m *machinistv1.Machine, v verdict, p *pass) {
	if !v.known {
		return
	}
	status := metav1.ConditionFalse
	if v.healthy {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionHealthCheckSucceeded, Status: status, Reason: v.reason,
		Message: fmt.Sprintf("%s (machinehealthcheck %s)", v.message, p.hc.Name), ObservedGeneration: m.Generation,
	})
}

// down returns why the WorkloadCluster of m, connected before, cannot be
// reached now, as its Reachable condition says; nil while it can. One
// read per cluster and pass.
func (r *Reconciler) down(ctx context.Context, p *pass, m *machinistv1.Machine) (*nodes.NotConnectedError, error) {
	if nc, ok := p.down[m.Spec.ClusterName]; ok {
		return nc, nil
	}
	reach, err := nodes.Reachability(ctx, r.Client, m)
	if err != nil {
		return nil, err
	}
	nc := reach.Down
	if p.down == nil {
		p.down = map[string]*nodes.NotConnectedError{}
	}
	p.down[m.Spec.ClusterName] = nc
	return nc, nil
}

// setUnseen says on the HealthCheckSucceeded condition why a Machine whose
// cluster cannot be reached is not judged. Not while the first connection
// is being made: a manager's start would otherwise write every Machine of
// every workload cluster twice.
func setUnseen(m *machinistv1.Machine, nc *nodes.NotConnectedError, p *pass) {
	if nc == nil || nc.Err == nil {
		return
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionHealthCheckSucceeded, Status: metav1.ConditionUnknown, Reason: machinistv1.ReasonClusterUnreachable,
		Message: fmt.Sprintf("%s: its Node is not judged, and nothing is held against it (machinehealthcheck %s)",
			nc.Unseen(), p.hc.Name),
		ObservedGeneration: m.Generation,
	})
}

// setRemediating mirrors status.remediation in the Remediating
// condition: True, with the rung's action as its reason, while a rung is
// in progress; False, with the phase as its reason, otherwise. A Machine
// never found unhealthy has neither.
func setRemediating(m *machinistv1.Machine) {
	rem := m.Status.Remediation
	if rem == nil {
		return
	}
	c := metav1.Condition{Type: machinistv1.ConditionRemediating, Status: metav1.ConditionFalse, Reason: string(rem.Phase),
		Message: rem.Message, ObservedGeneration: m.Generation}
	if remediating(rem.Phase) {
		c.Status, c.Reason = metav1.ConditionTrue, string(rem.Action)
	}
	if c.Message == "" {
		c.Message = string(rem.Phase)
	}
	meta.SetStatusCondition(&m.Status.Conditions, c)
}

// setAllowed sets the check's RemediationAllowed condition and emits an
// Event when it changes.
func (r *Reconciler) setAllowed(hc *machinistv1.MachineHealthCheck, st *machinistv1.MachineHealthCheckStatus, held string) {
	c := metav1.Condition{Type: machinistv1.ConditionRemediationAllowed, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonWithinLimits,
		Message: "unhealthy Machines are within maxUnhealthy", ObservedGeneration: hc.Generation}
	if held != "" {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, machinistv1.ReasonTooManyUnhealthy, held
	}
	old := meta.FindStatusCondition(st.Conditions, c.Type)
	st.Conditions = slices.Clone(st.Conditions)
	meta.SetStatusCondition(&st.Conditions, c)
	if r.Recorder == nil || (old != nil && old.Status == c.Status) {
		return
	}
	if held != "" {
		r.Recorder.Eventf(hc, nil, corev1.EventTypeWarning, "RemediationShortCircuited", "Remediate", "%s", held)
	} else if old != nil {
		r.Recorder.Eventf(hc, nil, corev1.EventTypeNormal, "RemediationAllowed", "Remediate", "%s", c.Message)
	}
}

// setReachable sets the check's ClustersReachable condition once any of
// its Machines is left unjudged because its workload cluster is found down
// (not while a first connection is made), and emits an Event when it
// changes: one each way per outage. Its message names the clusters and
// counts their Machines, which change only with the outage, so a check
// writes nothing more while a cluster stays down.
func (r *Reconciler) setReachable(hc *machinistv1.MachineHealthCheck, st *machinistv1.MachineHealthCheckStatus, targets []*target) {
	count, reason := map[string]int{}, map[string]string{}
	for _, t := range targets {
		if nc := t.unseen; nc != nil && nc.Err != nil {
			count[nc.Cluster.Name]++
			reason[nc.Cluster.Name] = nc.Reason
		}
	}
	old := meta.FindStatusCondition(st.Conditions, machinistv1.ConditionClustersReachable)
	if len(count) == 0 && old == nil {
		return
	}
	c := metav1.Condition{Type: machinistv1.ConditionClustersReachable, Status: metav1.ConditionTrue,
		Reason: machinistv1.ReasonReachable, Message: "the cluster of every selected Machine can be reached", ObservedGeneration: hc.Generation}
	if len(count) > 0 {
		names := slices.Sorted(maps.Keys(count))
		parts := make([]string, len(names))
		n := 0
		for i, name := range names {
			parts[i] = fmt.Sprintf("WorkloadCluster %s (%s): %d", name, reason[name], count[name])
			n += count[name]
		}
		c.Status, c.Reason = metav1.ConditionFalse, machinistv1.ReasonClusterUnreachable
		c.Message = fmt.Sprintf("%d Machines are neither judged nor remediated while their cluster cannot be reached: %s",
			n, strings.Join(parts, "; "))
	}
	st.Conditions = slices.Clone(st.Conditions)
	meta.SetStatusCondition(&st.Conditions, c)
	if r.Recorder == nil || (old != nil && old.Status == c.Status) {
		return
	}
	if c.Status == metav1.ConditionFalse {
		r.Recorder.Eventf(hc, nil, corev1.EventTypeWarning, machinistv1.ReasonClusterUnreachable, "Judge", "%s", c.Message)
	} else {
		r.Recorder.Eventf(hc, nil, corev1.EventTypeNormal, "ClusterReachable", "Judge", "%s", c.Message)
	}
}

// invalid is the status of a health check whose selector is not valid.
func invalid(hc *machinistv1.MachineHealthCheck, err error) *metav1.Condition {
	return &metav1.Condition{Type: machinistv1.ConditionRemediationAllowed, Status: metav1.ConditionFalse,
		Reason: machinistv1.ReasonInvalidSelector, Message: err.Error(), ObservedGeneration: hc.Generation}
}

// writeStatus writes the check's status when it changed.
func (r *Reconciler) writeStatus(ctx context.Context, hc *machinistv1.MachineHealthCheck, st machinistv1.MachineHealthCheckStatus, c *metav1.Condition) error {
	if c != nil {
		st.Conditions = slices.Clone(st.Conditions)
		meta.SetStatusCondition(&st.Conditions, *c)
	}
	if equality.Semantic.DeepEqual(hc.Status, st) {
		return nil
	}
	hc.Status = st
	if err := r.Client.Status().Update(ctx, hc); err != nil {
		return err
	}
	r.checkWrites.Wrote(hc)
	return nil
}

// exists reports whether the health check name is in the cache.
func (r *Reconciler) exists(ctx context.Context, ns, name string) bool {
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &machinistv1.MachineHealthCheck{})
	return !apierrors.IsNotFound(err)
}

// mine reports whether hc remediates m.
func mine(m *machinistv1.Machine, hc *machinistv1.MachineHealthCheck) bool {
	return m.Status.Remediation != nil && m.Status.Remediation.HealthCheck == hc.Name
}

// remediating reports whether a rung is in progress in phase.
func remediating(p machinistv1.RemediationPhase) bool {
	return p == machinistv1.RemediationRebooting || p == machinistv1.RemediationRepairing || p == machinistv1.RemediationReplacing
}

func unhealthySince(m *machinistv1.Machine) time.Time {
	if rem := m.Status.Remediation; rem != nil && rem.UnhealthySince != nil {
		return rem.UnhealthySince.Time
	}
	return time.Time{}
}

// scaled resolves a count or percentage of total; nil means def.
func scaled(v *intstr.IntOrString, def string, total int, roundUp bool) int {
	if v == nil {
		d := intstr.Parse(def)
		v = &d
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, roundUp)
	if err != nil {
		return 0
	}
	return n
}
