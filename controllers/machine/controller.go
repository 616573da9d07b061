// Package machine is the Machine controller: for every Machine it reads
// the world, runs the handler of the Machine's phase, fires the events of
// the state machine (package phases) that the world justifies, and writes
// the outcome in at most one status update. Handlers are grouped by
// concern: provision.go, running.go, drain.go, operation.go, delete.go.
package machine

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/requeue"
	"github.com/machinist-dev/machinist/internal/stale"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// Reconciler is the Machine controller: for every Machine it reads the
// world, fires the events the table allows and the world justifies, and
// writes the outcome in at most one status update.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Nodes is where every Machine's Node side is reached: its Node, its
	// kubelet's Lease, its pods and the drain.
	Nodes nodes.Clusters
	// Connections announces workload clusters as the manager connects to
	// them, so that their Nodes are watched; nil when there are none.
	Connections nodes.Connections
	// Recorder emits a Kubernetes Event per transition.
	Recorder events.EventRecorder
	// Actuators maps MachineClass.spec.provider to a provider.
	Actuators *providers.Registry
	// Metrics is updated on every transition; nil records none.
	Metrics *Metrics
	// ProvisionTimeout is how long a Machine may stay in Provisioning before
	// it is Failed. Zero means 10 minutes.
	ProvisionTimeout time.Duration
	// Backoff spaces retries after transient provider errors; its zero
	// value is 1s doubling up to 5m.
	Backoff Backoff
	// DrainPoll is how often a drain in progress is looked at again.
	// Zero means 2s.
	DrainPoll time.Duration
	// OperationTimeout is how long a rebooted or repaired Machine may take
	// to come back with a new boot ID and Ready before it is Failed. Zero
	// means 10 minutes.
	OperationTimeout time.Duration
	// APIReader reads past the cache: the disruption budgets an operation
	// asks before it starts, and whether the admission
	// policy that vouches for a request annotation's requester is in
	// force. Nil believes no requester.
	APIReader client.Reader
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Calendar is the clock the disruption budgets are asked on: their
	// windows open and close on it. Nil means time.Now.
	Calendar func() time.Time
	// DriftDelay is how long after a template changes its Machines'
	// Drifted conditions are brought up to date; zero means
	// DefaultDriftDelay.
	DriftDelay time.Duration
	// Namespace is the manager's own, where it keeps what no tenant may
	// read or write: the bootstrap token of a machine repaired while its
	// cluster could not be reached. Empty means DefaultNamespace.
	Namespace string
	// OwnCluster: the ManagementCluster is kept, and its Joinable
	// condition is why the machines of Machines with no clusterName
	// cannot join, when False.
	OwnCluster bool

	// writes keeps a reconcile from acting on a cached Machine older
	// than its own last write.
	writes stale.Writes
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	m := &machinistv1.Machine{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		if apierrors.IsNotFound(err) {
			r.writes.Forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if r.writes.Stale(ctx, r.APIReader, m) {
		return reconcile.Result{RequeueAfter: stale.Recheck}, nil
	}
	p, err := pause.Machine(ctx, r.Client, m)
	if err != nil {
		return reconcile.Result{}, err
	}
	if p.Paused() {
		return r.paused(ctx, m, p)
	}
	before := m.Status.DeepCopy()
	// Resumed: said in this reconcile's one write.
	pause.Mark(&m.Status.Conditions, p)
	s := &step{m: m, fsm: phases.New(m.Status.Phase), now: r.now()}

	ok, err := r.prepare(ctx, s)
	if ok {
		hs := live
		if !m.DeletionTimestamp.IsZero() {
			hs = deleting
		}
		err = r.drive(ctx, s, hs)
	}
	if m.DeletionTimestamp.IsZero() && !s.gone {
		err = errors.Join(err, r.setDrift(ctx, m))
	}
	if m.Status.Phase == "" && !s.gone {
		// Shown as Pending, not blank, even while nothing else can be
		// done for the Machine; it rides on the first write.
		m.Status.Phase = phases.Initial
	}
	keepTransitionTimes(before.Conditions, m.Status.Conditions)
	m.Status.SetFailureMessage()
	// A provider's or a Node's words past the schema's bounds would have
	// the write, and every later one, refused.
	m.Status.Fit()
	if !s.gone && !equality.Semantic.DeepEqual(before, &m.Status) {
		m.Status.ObservedGeneration = m.Generation
		if werr := r.Client.Status().Update(ctx, m); werr != nil {
			// Nothing fired is recorded: the next reconcile starts again
			// from the phase that is really stored.
			return requeue.Expected(reconcile.Result{}, errors.Join(err, werr))
		}
		r.writes.Wrote(m)
	}
	r.record(s)
	if s.ack != "" {
		if aerr := r.ackRequest(ctx, m, s.ack); aerr != nil {
			// The operation is stored; the next reconcile sees it
			// unacknowledged and removes the annotation then.
			err = errors.Join(err, aerr)
		} else {
			r.writes.Wrote(m)
		}
	}
	return requeue.Expected(reconcile.Result{RequeueAfter: s.requeue}, err)
}

// paused does nothing for a paused Machine but say so, once: no
// finalizer, no request taken, no provider call, no deletion run (its
// finalizer holds it until it is resumed), and nothing written again
// while it stays paused.
func (r *Reconciler) paused(ctx context.Context, m *machinistv1.Machine, p pause.Pause) (reconcile.Result, error) {
	if !pause.Mark(&m.Status.Conditions, p) {
		return reconcile.Result{}, nil
	}
	if err := r.Client.Status().Update(ctx, m); err != nil {
		return requeue.Expected(reconcile.Result{}, err)
	}
	r.writes.Wrote(m)
	if r.Recorder != nil {
		r.Recorder.Eventf(m, nil, corev1.EventTypeNormal, machinistv1.ConditionPaused, "Pause", "%s", p.Message)
	}
	return reconcile.Result{}, nil
}

// prepare does what every reconcile does before the phase's handler: a
// live Machine gets its finalizer and has its request annotation taken; a
// deleted one's operation in flight ends. Both find the Machine's class and
// where its Node lives. It reports false for a deleted Machine that only
// others' finalizers hold: this controller is done with it.
func (r *Reconciler) prepare(ctx context.Context, s *step) (bool, error) {
	m := s.m
	switch {
	case m.DeletionTimestamp.IsZero():
		if err := r.admitLive(ctx, s); err != nil {
			return false, err
		}
	case !controllerutil.ContainsFinalizer(m, machinistv1.MachineFinalizer):
		return false, nil
	case operation.InFlight(m.Status.Operation):
		endOperation(s, machinistv1.OperationFailed, "the Machine is being deleted")
	}
	var err error
	if s.class, err = r.class(ctx, m); err != nil {
		return false, err
	}
	s.nodes, err = r.Nodes.For(ctx, m)
	if nc, ok := nodes.NotConnected(err); ok {
		if nc.Err == nil {
			// The first connection is being made: the WorkloadCluster's
			// Reachable condition wakes the Machine when it is.
			s.wait("connecting to its cluster", connectingPoll)
			return false, nil
		}
		// No connection (a bad kubeconfig, or a cluster down since the
		// manager started): the handlers still run, for what needs no
		// Node side, such as a reboot without drain. Once the
		// WorkloadCluster says so, its reason and since when are the
		// Machine's, as they would be had the manager been connected: a
		// restart during an outage rewrites no Machine.
		reach, err := nodes.Reachability(ctx, r.Client, m)
		if err != nil {
			return false, err
		}
		if reach.Down != nil {
			nc.Reason, nc.Since = reach.Down.Reason, reach.Down.Since
		}
		s.nodes, s.down = nodes.Offline{Err: nc}, nc
		return true, nil
	}
	if err != nil {
		return false, err
	}
	reach, err := nodes.Reachability(ctx, r.Client, m)
	if err != nil {
		return false, err
	}
	// Connected, but found down by the prober: the cache still holds the
	// Nodes and Leases as they were, which must not be acted on.
	s.down, s.back = reach.Down, reach.Back
	return true, r.publishJoin(ctx, s)
}

// keepTransitionTimes gives every condition that ends the reconcile with
// the status and reason it began with its transition time from before:
// handlers that set a condition one way and then, later in the same
// reconcile, back (a drain that is over, then a wait for volumes) changed
// nothing, and must not cost a write. A condition whose reason changed
// keeps the time its handler chose: a wait that begins afresh begins now.
func keepTransitionTimes(before, after []metav1.Condition) {
	for i := range after {
		if c := meta.FindStatusCondition(before, after[i].Type); c != nil && c.Status == after[i].Status && c.Reason == after[i].Reason {
			after[i].LastTransitionTime = c.LastTransitionTime
		}
	}
}

// record emits an Event and metrics for each transition that is now stored.
func (r *Reconciler) record(s *step) {
	for i, t := range s.fired {
		if r.Metrics != nil {
			r.Metrics.observe(t, s.entered[i])
		}
		if r.Recorder != nil {
			r.Recorder.Eventf(s.m, nil, corev1.EventTypeNormal, eventReason(t), string(t.To),
				"%s -> %s (%s)", t.From, t.To, t.Event)
		}
	}
	if r.Recorder != nil {
		for _, n := range s.notes {
			r.Recorder.Eventf(s.m, nil, n.kind, n.reason, n.action, "%s", n.message)
		}
	}
}

func eventReason(t machinistv1.Transition) string {
	return "Machine" + string(t.To)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) provisionTimeout() time.Duration {
	if r.ProvisionTimeout > 0 {
		return r.ProvisionTimeout
	}
	return 10 * time.Minute
}

func (r *Reconciler) operationTimeout() time.Duration {
	if r.OperationTimeout > 0 {
		return r.OperationTimeout
	}
	return 10 * time.Minute
}

func (r *Reconciler) drainPoll() time.Duration {
	if r.DrainPoll > 0 {
		return r.DrainPoll
	}
	return 2 * time.Second
}
