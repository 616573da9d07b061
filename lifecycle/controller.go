package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/machinist-dev/machinist/actuators"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/disruption"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/requeue"
	"github.com/machinist-dev/machinist/internal/stale"
)

// Failure reasons a Machine can end with.
const (
	FailureCreate             = "CreateFailed"
	FailureProvisioningTimout = "ProvisioningTimeout"
)

// Reconciler is the Machine controller: for every Machine it reads the
// world, fires the events the table allows and the world justifies, and
// writes the outcome in at most one status update.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Kube is used by the drain, which speaks client-go.
	Kube kubernetes.Interface
	// Recorder emits a Kubernetes Event per transition.
	Recorder events.EventRecorder
	// Actuators maps MachineClass.spec.provider to a provider.
	Actuators *actuators.Registry
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

	// writes keeps a reconcile from acting on a cached Machine older
	// than its own last write.
	writes stale.Writes
}

// While a Machine has just entered Provisioning, it is looked at every
// provisionPoll for provisionPollFor; after that only Node events and the
// deadline wake it.
const (
	provisionPoll    = time.Second
	provisionPollFor = 10 * time.Second
)

// Backoff is capped exponential backoff: Base, 2*Base, 4*Base, … up to Cap.
type Backoff struct {
	Base time.Duration
	Cap  time.Duration
}

// After returns the delay before retry number n (1-based).
func (b Backoff) After(n int32) time.Duration {
	base, limit := b.Base, b.Cap
	if base <= 0 {
		base = time.Second
	}
	if limit <= 0 {
		limit = 5 * time.Minute
	}
	d := base
	for i := int32(1); i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// SetupWithManager registers the controller, its cache indexes and watches.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	idx := mgr.GetFieldIndexer()
	if err := index.Register(ctx, idx); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &machinistv1.Machine{}, machineByClass, func(o client.Object) []string {
		return []string{o.(*machinistv1.Machine).Spec.ClassRef.Name}
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.Machine{}, builder.WithPredicates(machineChanged())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.machinesForNode),
			builder.WithPredicates(nodeChanged())).
		Watches(&machinistv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.machinesForClass),
			builder.WithPredicates(classChanged())).
		Watches(&machinistv1.MachineSet{}, r.templateChanged()).
		Watches(&machinistv1.MachineDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.heldMachines),
			builder.WithPredicates(disruption.Freed())).
		Watches(&machinistv1.MachineDeployment{}, r.templateChanged()).
		WithOptions(opts).
		Named("machine").
		Complete(r)
}

// nodeChanged passes Node events that can change a Machine's conclusions;
// kubelet heartbeats that change nothing else are dropped.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		or, nr := nodeCondition(o, corev1.NodeReady), nodeCondition(n, corev1.NodeReady)
		sameReady := (or == nil) == (nr == nil) && (or == nil || or.Status == nr.Status)
		return !sameReady ||
			o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID ||
			o.Spec.ProviderID != n.Spec.ProviderID ||
			o.Spec.Unschedulable != n.Spec.Unschedulable ||
			!equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints)
	}}
}

func (r *Reconciler) machinesForNode(ctx context.Context, o client.Object) []reconcile.Request {
	node := o.(*corev1.Node)
	if node.Spec.ProviderID == "" {
		return nil
	}
	return r.machinesMatching(ctx, "Node "+node.Name, client.MatchingFields{machineByProviderID: node.Spec.ProviderID})
}

// machinesMatching maps a watched object (what) to the Machines that opts
// select in the cache.
func (r *Reconciler) machinesMatching(ctx context.Context, what string, opts ...client.ListOption) []reconcile.Request {
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		log.FromContext(ctx).Error(err, "mapping to Machines", "from", what)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// step is one reconcile of one Machine: the state machine rebuilt from
// status, the transitions fired so far, and when to look again.
type step struct {
	m       *machinistv1.Machine
	fsm     *Machine
	now     time.Time
	fired   []machinistv1.Transition
	entered []time.Time // when each fired transition's From phase was entered
	requeue time.Duration
	gone    bool
	// notes are Events about operations, emitted once the status that
	// holds them is stored.
	notes []note
	// ack is the ID of an operation requested by annotation whose
	// annotation is removed once the operation is stored.
	ack string
	// requested is the ID of an operation this step recorded (from the
	// annotation or a changed version), not stored yet.
	requested string
}

// unstored reports whether op was recorded by this step and is not yet
// stored. Such an operation waits for the step's write before anything is
// done for it: were the write refused or its reply lost after the budgets
// had admitted it and the provider acted, the budgets would hold a record
// of an operation no Machine holds, counting the Machine as disrupted
// until the record lapsed, and the next look, finding the Node already
// updated, would start none. Stored first, it is carried out under its one
// ID, however often a later write fails. Its write wakes the controller:
// a new operation ID passes machineChanged.
func (s *step) unstored(op *machinistv1.Operation) bool {
	return op != nil && op.ID == s.requested
}

// note is one Event to emit after the status write.
type note struct {
	kind, reason, action, message string
}

func (s *step) note(kind, reason, action, format string, args ...any) {
	s.notes = append(s.notes, note{kind: kind, reason: reason, action: action, message: fmt.Sprintf(format, args...)})
}

func (s *step) after(d time.Duration) {
	if d > 0 && (s.requeue == 0 || d < s.requeue) {
		s.requeue = d
	}
}

// enteredAt is when the Machine entered its current phase.
func (s *step) enteredAt() time.Time {
	if t := s.m.Status.LastTransition; t != nil {
		return t.Time.Time
	}
	return s.m.CreationTimestamp.Time
}

// fire moves the Machine by e and records the transition in status; an
// event the table does not allow is an error and changes nothing.
func (s *step) fire(e Event) error {
	entered := s.enteredAt()
	from, to, err := s.fsm.Fire(e)
	if err != nil {
		return err
	}
	t := machinistv1.Transition{From: from, To: to, Event: string(e), Time: metav1.NewTime(s.now)}
	s.m.Status.Phase = to
	s.m.Status.LastTransition = &t
	s.m.Status.ErrorCount = 0
	s.fired = append(s.fired, t)
	s.entered = append(s.entered, entered)
	return nil
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
	if r.writes.Stale(m) {
		return reconcile.Result{RequeueAfter: stale.Recheck}, nil
	}
	before := m.Status.DeepCopy()
	s := &step{m: m, fsm: New(m.Status.Phase), now: r.now()}

	var err error
	if m.DeletionTimestamp.IsZero() {
		err = r.reconcileLive(ctx, s)
		if !s.gone {
			err = errors.Join(err, r.setDrift(ctx, m))
		}
	} else {
		err = r.reconcileDelete(ctx, s)
	}
	if m.Status.Phase == "" && !s.gone {
		// Shown as Pending, not blank, even while nothing else can be
		// done for the Machine; it rides on the first write.
		m.Status.Phase = Initial
	}
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

// class returns the Machine's MachineClass, or nil if it does not exist.
func (r *Reconciler) class(ctx context.Context, m *machinistv1.Machine) (*machinistv1.MachineClass, error) {
	c := &machinistv1.MachineClass{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClassRef.Name}, c)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return c, err
}

// Reasons a Machine waits for its provider.
const (
	ReasonClassNotFound    = "MachineClassNotFound"
	ReasonProviderNotFound = "ProviderNotFound"
	// ReasonProviderUnavailable: the provider runs out of process and
	// does not answer. Whatever the Machine was doing waits for it.
	ReasonProviderUnavailable = "ProviderUnavailable"
	ReasonBadProviderID       = "InvalidProviderID"
)

// unavailable is why no provider can act for a Machine now: a reason for
// its Ready condition and a message for people.
type unavailable struct {
	reason string
	err    error
}

// actuatorFor picks the provider for a Machine: by its class while it has
// no instance, then by its providerID's scheme, so a Machine can still be
// deleted after its class is gone.
func (r *Reconciler) actuatorFor(m *machinistv1.Machine, class *machinistv1.MachineClass) (actuators.Actuator, *unavailable) {
	if id := m.Status.ProviderID; id != "" {
		u, err := url.Parse(id)
		if err != nil || u.Scheme == "" {
			return nil, &unavailable{ReasonBadProviderID, fmt.Errorf("providerID %q does not start with <provider>://", id)}
		}
		act, err := r.Actuators.Get(u.Scheme)
		if err != nil {
			return nil, &unavailable{ReasonProviderNotFound, fmt.Errorf("providerID %q: %w", id, err)}
		}
		return act, nil
	}
	if class == nil {
		return nil, &unavailable{ReasonClassNotFound, fmt.Errorf(
			"MachineClass %q does not exist in namespace %q; create it, or fix spec.classRef.name",
			m.Spec.ClassRef.Name, m.Namespace)}
	}
	act, err := r.Actuators.Get(class.Spec.Provider)
	if err != nil {
		return nil, &unavailable{ReasonProviderNotFound, fmt.Errorf("MachineClass %q names provider %q: %w",
			class.Name, class.Spec.Provider, err)}
	}
	return act, nil
}

// retry records a transient error and schedules the next attempt. The
// Machine says why it waits in its Ready condition; a Warning Event marks
// only a change of reason, not every attempt.
func (r *Reconciler) retry(s *step, reason string, err error) {
	if actuators.IsUnavailable(err) {
		reason = ReasonProviderUnavailable
	}
	s.m.Status.ErrorCount++
	delay := r.Backoff.After(s.m.Status.ErrorCount)
	if c := meta.FindStatusCondition(s.m.Status.Conditions, machinistv1.ConditionReady); c == nil || c.Reason != reason {
		s.note(corev1.EventTypeWarning, reason, "Retry", "%v", err)
	}
	meta.SetStatusCondition(&s.m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message:            fmt.Sprintf("%v (attempt %d; next in %s)", err, s.m.Status.ErrorCount, delay),
		ObservedGeneration: s.m.Generation,
	})
	s.after(delay)
}

// failMachine moves the Machine to Failed with a reason for people.
func (s *step) failMachine(reason, message string) error {
	if err := s.fire(Fail); err != nil {
		return err
	}
	s.m.Status.FailureReason = reason
	s.m.Status.FailureMessage = message
	meta.SetStatusCondition(&s.m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: message, ObservedGeneration: s.m.Generation,
	})
	return nil
}

func (r *Reconciler) reconcileLive(ctx context.Context, s *step) error {
	m := s.m
	// A MachineSet sets the finalizer at creation; only a Machine made by
	// hand costs this extra write.
	if controllerutil.AddFinalizer(m, machinistv1.MachineFinalizer) {
		if err := r.Client.Update(ctx, m); err != nil {
			return err
		}
		r.writes.Wrote(m)
	}
	if v, ok := m.Annotations[machinistv1.RequestAnnotation]; ok {
		if err := r.takeRequest(ctx, s, v); err != nil {
			return err
		}
	} else if _, ok := m.Annotations[machinistv1.RequestedByAnnotation]; ok {
		// Someone removed a request before it was taken: its requester
		// must not linger as if a request were waiting.
		if err := r.ackRequest(ctx, m, ""); err != nil {
			return err
		}
	}
	class, err := r.class(ctx, m)
	if err != nil {
		return err
	}

	switch s.fsm.State() {
	case machinistv1.MachinePending:
		act, why := r.actuatorFor(m, class)
		if why != nil {
			r.retry(s, why.reason, why.err)
			return nil
		}
		id, err := act.Create(ctx, m, class)
		if actuators.IsPermanent(err) {
			return s.failMachine(FailureCreate, err.Error())
		}
		if err != nil {
			r.retry(s, "CreateError", err)
			return nil
		}
		m.Status.ProviderID = id
		if err := s.fire(Provision); err != nil {
			return err
		}
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Provisioning",
			Message: "waiting for the Node with providerID " + id + " to become Ready", ObservedGeneration: m.Generation,
		})
		fallthrough

	case machinistv1.MachineProvisioning:
		node, err := r.nodeFor(ctx, m.Status.ProviderID)
		if err != nil {
			return err
		}
		if node == nil || !isReady(node) {
			deadline := s.enteredAt().Add(r.provisionTimeout())
			if !s.now.Before(deadline) {
				return s.failMachine(FailureProvisioningTimout, fmt.Sprintf(
					"no Ready Node with providerID %s after %s", m.Status.ProviderID, r.provisionTimeout()))
			}
			s.after(deadline.Sub(s.now))
			if s.now.Sub(s.enteredAt()) < provisionPollFor {
				// A Node that turned Ready before the cache held this
				// Machine's providerID mapped to no Machine, and the
				// controller's own write wakes nothing: look again.
				s.after(provisionPoll)
			}
			return nil
		}
		r.observeNode(m, node)
		if err := s.fire(Provisioned); err != nil {
			return err
		}
		fallthrough

	case machinistv1.MachineRunning:
		node, err := r.nodeFor(ctx, m.Status.ProviderID)
		if err != nil {
			return err
		}
		h, err := r.nodeHealth(ctx, node, s.now)
		if err != nil {
			return err
		}
		setHealth(m, h)
		if !h.recheck.IsZero() {
			s.after(h.recheck.Sub(s.now) + time.Second)
		}
		if node != nil && !h.healthy && h.reason == reasonNodeLeaseExpired && isReady(node) {
			// A kubelet that came back posts Ready before it renews its
			// Lease, and renewals wake no reconcile: look again soon.
			s.after(r.drainPoll())
		}
		if node != nil {
			r.observeNode(m, node)
			if err := r.applyNodeSpec(ctx, node, m, class, false); err != nil {
				return err
			}
		}
		op := m.Status.Operation
		if !InFlight(op) {
			if op = r.updateFor(ctx, s, class, node); op == nil {
				return nil
			}
		}
		if s.unstored(op) {
			return nil
		}
		if op.State == machinistv1.OperationPending {
			if held, err := r.holdForBudget(ctx, s, op); err != nil || held {
				return err
			}
			startOperation(s)
		}
		if !drains(op.Type, op.Options) {
			return r.callProvider(ctx, s, class)
		}
		if err := s.fire(Drain); err != nil {
			return err
		}
		fallthrough

	case machinistv1.MachineDraining:
		// A Machine that is not being deleted drains only for an operation.
		op := m.Status.Operation
		if !InFlight(op) {
			// Its record was lost or cleared by hand: back to service.
			return r.abort(ctx, s, "no reboot or repair is in flight")
		}
		if d := deadlineOf(op); !d.IsZero() {
			if !s.now.Before(d) {
				return r.abort(ctx, s, fmt.Sprintf("the %s's timeout of %ds passed while draining: %s", verbOf(op.Type),
					*op.Options.TimeoutSeconds, conditionMessage(m, machinistv1.ConditionDrained)))
			}
			s.after(d.Sub(s.now))
		}
		done, err := r.drain(ctx, s, class, gerund(verbOf(op.Type)))
		if err != nil || !done {
			return err
		}
		return r.callProvider(ctx, s, class)

	case machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineUpdating:
		return r.awaitBoot(ctx, s, class)

	case machinistv1.MachineFailed:
		// Only a repair moves a Failed Machine; Admit let no other in.
		op := m.Status.Operation
		if !InFlight(op) || s.unstored(op) {
			return nil
		}
		if op.State == machinistv1.OperationPending {
			startOperation(s)
		}
		return r.callProvider(ctx, s, class)
	}
	return nil
}

// conditionMessage is the message of m's condition t, or "".
func conditionMessage(m *machinistv1.Machine, t string) string {
	if c := meta.FindStatusCondition(m.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

func (r *Reconciler) reconcileDelete(ctx context.Context, s *step) error {
	m := s.m
	if !controllerutil.ContainsFinalizer(m, machinistv1.MachineFinalizer) {
		return nil
	}
	if InFlight(m.Status.Operation) {
		endOperation(s, machinistv1.OperationFailed, "the Machine is being deleted")
	}
	class, err := r.class(ctx, m)
	if err != nil {
		return err
	}
	switch s.fsm.State() {
	case machinistv1.MachineRunning:
		if err := s.fire(Drain); err != nil {
			return err
		}
		fallthrough

	case machinistv1.MachineDraining:
		done, err := r.drain(ctx, s, class, "deleting")
		if err != nil || !done {
			return err
		}
		fallthrough

	case machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRebooting,
		machinistv1.MachineRepairing, machinistv1.MachineUpdating, machinistv1.MachineFailed:
		if s.fsm.State() != machinistv1.MachineDeleting {
			if err := s.fire(Delete); err != nil {
				return err
			}
		}
		fallthrough

	case machinistv1.MachineDeleting:
		if m.Status.ProviderID == "" {
			id, err := r.findInstance(ctx, m)
			if err != nil {
				r.retry(s, "DeleteError", err)
				return nil
			}
			m.Status.ProviderID = id
		}
		if m.Status.ProviderID != "" {
			act, why := r.actuatorFor(m, class)
			if why != nil {
				r.retry(s, why.reason, why.err)
				return nil
			}
			if err := act.Delete(ctx, m.Status.ProviderID); err != nil {
				r.retry(s, "DeleteError", err)
				return nil
			}
			exists, err := act.Exists(ctx, m.Status.ProviderID)
			if err != nil || exists {
				if err == nil {
					err = fmt.Errorf("instance %s still exists", m.Status.ProviderID)
				}
				r.retry(s, "DeleteError", err)
				return nil
			}
		}
		if err := r.deleteNode(ctx, m); err != nil {
			return err
		}
		// Deleted is stored by no status: the Machine is gone with it. If
		// the finalizer stays (a conflict, a refusal), the Machine is still
		// Deleting, and must not be written as Deleted, which no move leaves.
		deleting := m.Status.DeepCopy()
		if err := s.fire(Deleted); err != nil {
			return err
		}
		controllerutil.RemoveFinalizer(m, machinistv1.MachineFinalizer)
		if err := r.Client.Update(ctx, m); err != nil {
			s.fired = s.fired[:len(s.fired)-1]
			s.entered = s.entered[:len(s.entered)-1]
			m.Status = *deleting
			return client.IgnoreNotFound(err)
		}
		if len(m.Finalizers) == 0 {
			// Gone from the API server, not yet from the cache: an event
			// meanwhile (its Node's deletion) must not delete it again.
			r.writes.Removed(m)
		} else {
			r.writes.Wrote(m)
		}
		s.gone = true
	}
	return nil
}

// findInstance asks every provider for an instance made for m, which has
// no providerID stored: Create may have succeeded without its answer being
// recorded, and m's class (or which provider it named) may have changed
// since. "" means no provider has one.
func (r *Reconciler) findInstance(ctx context.Context, m *machinistv1.Machine) (string, error) {
	for _, name := range r.Actuators.Names() {
		act, err := r.Actuators.Get(name)
		if err != nil {
			continue
		}
		id, err := act.FindByUID(ctx, m.UID)
		if err != nil {
			return "", fmt.Errorf("asking provider %q for the instance of Machine UID %s: %w", name, m.UID, err)
		}
		if id != "" {
			return id, nil
		}
	}
	return "", nil
}

// drain does one round of draining and reports whether it is over; next
// says what happens after a drain that timed out ("deleting").
func (r *Reconciler) drain(ctx context.Context, s *step, class *machinistv1.MachineClass, next string) (bool, error) {
	m := s.m
	setDrained := func(status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionDrained, Status: status, Reason: reason, Message: message, ObservedGeneration: m.Generation,
		})
	}
	if hooks := preDrainHooks(m); len(hooks) > 0 {
		setDrained(metav1.ConditionFalse, reasonPreDrainHook, fmt.Sprintf("waiting for pre-drain hook annotation(s) to be removed: %v", hooks))
		return false, nil
	}
	node, err := r.nodeFor(ctx, m.Status.ProviderID)
	if err != nil {
		return false, err
	}
	if node == nil {
		setDrained(metav1.ConditionTrue, reasonDrainComplete, "the Machine has no Node to drain")
		return true, nil
	}
	h, err := r.nodeHealth(ctx, node, s.now)
	if err != nil {
		return false, err
	}
	setHealth(m, h)
	settings := effectiveDrain(m, class)
	if op := m.Status.Operation; InFlight(op) && op.Options != nil && op.Options.GracePeriodSeconds != nil {
		settings.GracePeriodSeconds = op.Options.GracePeriodSeconds
	}
	out, err := drainStep(ctx, r.Kube, node, settings, h.healthy)
	if err != nil {
		return false, err
	}
	if out.done {
		setDrained(metav1.ConditionTrue, out.reason, out.message)
		return true, nil
	}
	if deadline := drainDeadline(s.enteredAt(), settings); !deadline.IsZero() {
		if !s.now.Before(deadline) {
			msg := fmt.Sprintf("drain timeout %s passed; %s anyway: %s", settings.Timeout.Duration, next, out.message)
			setDrained(metav1.ConditionFalse, reasonDrainTimeout, msg)
			if r.Recorder != nil {
				r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, reasonDrainTimeout, "Drain", msg)
			}
			return true, nil
		}
	}
	setDrained(metav1.ConditionFalse, out.reason, out.message)
	s.after(r.drainRecheck(s.now.Sub(s.enteredAt())))
	return false, nil
}

// drainRecheck is how long to wait before the next round of a drain that
// has gone on for elapsed: DrainPoll at first, then a quarter of the time
// spent, up to 30 s. A drain that a PodDisruptionBudget holds for long
// then asks for evictions a few times a minute, not every DrainPoll.
func (r *Reconciler) drainRecheck(elapsed time.Duration) time.Duration {
	return max(r.drainPoll(), min(elapsed/4, 30*time.Second))
}

// deleteNode deletes the Machine's Node, if there is one.
func (r *Reconciler) deleteNode(ctx context.Context, m *machinistv1.Machine) error {
	node, err := r.nodeFor(ctx, m.Status.ProviderID)
	if err != nil || node == nil {
		return err
	}
	if err := r.Client.Delete(ctx, node); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting node %s: %w", node.Name, err)
	}
	// Drop the kubelet's Lease with it, as the node lifecycle would by
	// garbage collection through its owner reference.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node.Name}}
	return client.IgnoreNotFound(r.Client.Delete(ctx, lease))
}

// observeNode copies what the Machine records about its Node.
func (r *Reconciler) observeNode(m *machinistv1.Machine, node *corev1.Node) {
	m.Status.NodeRef = &machinistv1.NodeReference{Name: node.Name, UID: string(node.UID)}
	m.Status.BootID = node.Status.NodeInfo.BootID
	info := node.Status.NodeInfo
	m.Status.NodeInfo = &info
}

func isReady(node *corev1.Node) bool {
	c := nodeCondition(node, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// setHealth writes the NodeHealthy and Ready conditions of a Running Machine.
func setHealth(m *machinistv1.Machine, h health) {
	status := metav1.ConditionFalse
	if h.healthy {
		status = metav1.ConditionTrue
	}
	for _, t := range []string{machinistv1.ConditionNodeHealthy, machinistv1.ConditionReady} {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: t, Status: status, Reason: h.reason, Message: h.message, ObservedGeneration: m.Generation,
		})
	}
}
