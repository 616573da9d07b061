// Package machineset keeps each MachineSet's number of Machines: it creates
// Machines from the template, removes surplus ones in a declared order,
// adopts orphans its selector matches and releases Machines that stop
// matching.
package machineset

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	generate "k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/outcome"
	"github.com/machinist-dev/machinist/internal/pace"
	"github.com/machinist-dev/machinist/internal/requeue"
	"github.com/machinist-dev/machinist/internal/stale"
	"github.com/machinist-dev/machinist/internal/wake"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/pause"
)

// Reasons of Events and of the Ready condition.
const (
	reasonAdopted      = "Adopted"
	reasonReleased     = "Released"
	reasonCreated      = "MachineCreated"
	reasonDeleted      = "MachineDeleted"
	reasonCreateFailed = "CreateFailed"
)

// maxBatch caps how many Machines one reconcile creates or deletes in
// parallel; creation starts at one and doubles while requests succeed (slow
// start, as Kubernetes' ReplicaSet does), so a bad template costs one
// failed request, not hundreds.
const maxBatch = 64

// Reconciler is the MachineSet controller.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads past the cache: the disruption budgets a rollout's
	// deletion asks first. Nil asks none.
	APIReader client.Reader
	// Recorder emits Events on MachineSets.
	Recorder events.EventRecorder
	// StatusInterval is the shortest time between two status writes of one
	// MachineSet whose spec did not change, so that a thousand Machines
	// becoming Ready cost a few status writes, not a thousand. Zero means 1s.
	StatusInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Calendar is the clock the disruption budgets are asked on: their
	// windows open and close on it. Nil means time.Now.
	Calendar func() time.Time
	// PerMachine paces the reconciles that changes of a set's Machines
	// ask for: a set of N Machines is looked at no more than once per
	// N × PerMachine for them (see package pace). Zero means
	// pace.DefaultPerObject. Changes that may let it scale (the last
	// creation or deletion it awaited) and changes of ownership or labels
	// wake it at once.
	PerMachine time.Duration

	pacer        pace.Pacer
	once         sync.Once
	expectations *expectations
	rndMu        sync.Mutex
	rnd          *rand.Rand
	lastWrite    sync.Map // MachineSet key -> time of its last status write
	// cache is the manager's cache, whose index of Machines by controller
	// claim reads; nil lists the namespace through Client.
	cache cache.Cache
	// writes keeps a reconcile from writing the status of a cached set
	// older than its own last status write: a Machine's event often wakes
	// it milliseconds after that write, and the write would be refused.
	writes stale.Writes
	// statuses holds, per set, the status this controller last wrote or
	// tried to write. A status that changes to anything else (a write of
	// its own stored late, after a newer one) wakes the set, so the
	// status it leaves is always the last it decided.
	statuses sync.Map // types.NamespacedName -> machinistv1.MachineSetStatus
}

func (r *Reconciler) init() {
	r.once.Do(func() {
		if r.Now == nil {
			r.Now = time.Now
		}
		r.expectations = newExpectations(r.Now)
		// The pacer keeps real time, as the work queue's delays do.
		r.pacer.PerObject = r.PerMachine
		r.rnd = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x6d61636869))
	})
}

// SetupWithManager registers the controller and its watches.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	r.init()
	if err := index.Register(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	r.cache = mgr.GetCache()
	return ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.MachineSet{}, builder.WithPredicates(predicate.Or(wake.OnChangeByOthers(), r.statusNotMine()))).
		Watches(&machinistv1.Machine{}, &machineHandler{r: r}).
		Watches(&machinistv1.MachineDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.heldSets),
			builder.WithPredicates(disruption.Freed())).
		// A class's Nodes are what the sets no deployment owns publish.
		Watches(&machinistv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.setsOfClass),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(opts).
		Named("machineset").
		Complete(r)
}

// heldSets maps a budget that freed room to the sets of its namespace a
// budget holds (their Ready condition says DisruptionHeld).
func (r *Reconciler) heldSets(ctx context.Context, o client.Object) []reconcile.Request {
	var list machinistv1.MachineSetList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if c := meta.FindStatusCondition(list.Items[i].Status.Conditions, machinistv1.ConditionReady); c != nil && c.Reason == machinistv1.ReasonDisruptionHeld {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.init()
	ms := &machinistv1.MachineSet{}
	if err := r.Client.Get(ctx, req.NamespacedName, ms); err != nil {
		if apierrors.IsNotFound(err) {
			r.expectations.forget(req.NamespacedName)
			r.lastWrite.Delete(req.NamespacedName)
			r.writes.Forget(req.NamespacedName)
			r.statuses.Delete(req.NamespacedName)
			r.pacer.Forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if r.writes.Stale(ctx, r.APIReader, ms) {
		return reconcile.Result{RequeueAfter: stale.Recheck}, nil
	}
	if p := pause.Of(ms, "MachineSet"); p.Paused() {
		return reconcile.Result{}, r.paused(ctx, ms, p)
	}
	selector, err := metav1.LabelSelectorAsSelector(ms.Spec.Selector.AsMeta())
	if err != nil {
		return reconcile.Result{}, reconcile.TerminalError(fmt.Errorf("invalid selector: %w", err))
	}
	// Asked before the cache is read, as Kubernetes' ReplicaSet does: a
	// Machine this set created whose event arrived between the read and
	// the question would be neither awaited any more nor counted, and
	// would be created again. Satisfied now, every write it made is in
	// what claim reads next.
	caughtUp := r.expectations.satisfied(req.NamespacedName)
	owned, receiving, err := r.claim(ctx, ms, selector)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.pacer.Looked(req.NamespacedName, len(owned))

	var scaleErr, publishErr error
	var held *disruption.Refusal
	if ms.DeletionTimestamp.IsZero() {
		// Retried with the reconcile's error, but never in the way of
		// the Machines the set must make or remove.
		publishErr = r.publish(ctx, ms)
	}
	if ms.DeletionTimestamp.IsZero() && caughtUp {
		held, scaleErr = r.scale(ctx, ms, handedOver(ms, owned), receiving)
	}
	res, err := r.updateStatus(ctx, ms, owned, selector, held)
	if held != nil && (res.RequeueAfter == 0 || held.RetryAfter < res.RequeueAfter) {
		res.RequeueAfter = held.RetryAfter
	}
	return requeue.Expected(res, errors.Join(publishErr, scaleErr, err))
}

// claim returns the Machines ms owns after adopting matching orphans and
// releasing owned Machines that no longer match, and the Machines another
// set is handing over to it (ReceivingAnnotation) that it does not own yet.
func (r *Reconciler) claim(ctx context.Context, ms *machinistv1.MachineSet, selector labels.Selector) (owned, receiving []*machinistv1.Machine, err error) {
	// The cache's own objects, by index, not copies: a set of thousands
	// is looked at on every reconcile, and nothing below modifies them.
	mine, err := index.Machines(ctx, r.Client, r.cache, ms.Namespace, string(ms.UID))
	if err != nil {
		return nil, nil, err
	}
	for _, m := range mine {
		if m.DeletionTimestamp.IsZero() && !selector.Matches(labels.Set(m.Labels)) {
			if err := r.release(ctx, ms, m); err != nil {
				return nil, nil, err
			}
			continue
		}
		owned = append(owned, m)
	}
	orphans, err := index.Machines(ctx, r.Client, r.cache, ms.Namespace, index.Orphan)
	if err != nil {
		return nil, nil, err
	}
	incoming := names(ms.Annotations[machinistv1.ReceivingAnnotation])
	for _, m := range orphans {
		if incoming[m.Name] && m.DeletionTimestamp.IsZero() {
			receiving = append(receiving, m)
			delete(incoming, m.Name)
		}
		if !selector.Matches(labels.Set(m.Labels)) || !m.DeletionTimestamp.IsZero() || !ms.DeletionTimestamp.IsZero() {
			continue
		}
		adopted, err := r.adopt(ctx, ms, m)
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				continue // changed under us; the next event brings it back
			}
			return nil, nil, err
		}
		owned = append(owned, adopted)
	}
	// Machines handed over by another set, still its own.
	for name := range incoming {
		m := &machinistv1.Machine{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ms.Namespace, Name: name}, m); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, nil, err
		}
		if ref := metav1.GetControllerOf(m); ref != nil && ref.UID != ms.UID && m.DeletionTimestamp.IsZero() {
			receiving = append(receiving, m)
		}
	}
	return owned, receiving, nil
}

// handedOver is owned without the Machines ms is handing over to another
// set (ReleasingAnnotation): those are no longer its to count or delete.
func handedOver(ms *machinistv1.MachineSet, owned []*machinistv1.Machine) []*machinistv1.Machine {
	leaving := names(ms.Annotations[machinistv1.ReleasingAnnotation])
	if len(leaving) == 0 {
		return owned
	}
	var out []*machinistv1.Machine
	for _, m := range owned {
		if !leaving[m.Name] {
			out = append(out, m)
		}
	}
	return out
}

// names parses a comma-separated list of Machine names.
func names(list string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out[n] = true
		}
	}
	return out
}

func (r *Reconciler) adopt(ctx context.Context, ms *machinistv1.MachineSet, m *machinistv1.Machine) (*machinistv1.Machine, error) {
	patched := m.DeepCopy()
	patched.OwnerReferences = append(patched.OwnerReferences, *metav1.NewControllerRef(ms, machinistv1.GroupVersion.WithKind("MachineSet")))
	// The optimistic lock makes adoption exclusive: if two sets race for an
	// orphan, one of them gets a conflict.
	if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	r.event(ms, corev1.EventTypeNormal, reasonAdopted, "Adopt", "adopted orphan Machine %s", m.Name)
	return patched, nil
}

func (r *Reconciler) release(ctx context.Context, ms *machinistv1.MachineSet, m *machinistv1.Machine) error {
	patched := m.DeepCopy()
	refs := patched.OwnerReferences[:0]
	for _, ref := range patched.OwnerReferences {
		if ref.UID != ms.UID {
			refs = append(refs, ref)
		}
	}
	patched.OwnerReferences = refs
	if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.event(ms, corev1.EventTypeNormal, reasonReleased, "Release", "released Machine %s: its labels no longer match the selector", m.Name)
	return nil
}

// scale creates or deletes Machines so that ms owns spec.replicas of them.
// Machines already deleting still count, so the set never holds more
// Machines than asked for; they are the first chosen on scale-down.
// Machines being handed over to it (receiving) count too, but it deletes
// only its own.
// scale creates or deletes Machines to reach spec.replicas. A deletion a
// disruption budget refuses (a rollout's, see RollingOutAnnotation) waits:
// held says why and when to ask again.
func (r *Reconciler) scale(ctx context.Context, ms *machinistv1.MachineSet, owned, receiving []*machinistv1.Machine) (held *disruption.Refusal, err error) {
	key := client.ObjectKeyFromObject(ms)
	want := int(ptrOr(ms.Spec.Replicas, 1))
	switch diff := len(owned) + len(receiving) - want; {
	case diff < 0:
		// Creations whose outcome is unknown go first, under their own
		// names: each was stored already or is stored now, never twice.
		names := r.expectations.unsureCreates(key)
		// One already counted was stored: its reply was lost after the
		// watch had shown it. Repeated, it would be found there and
		// counted as a new Machine; the set would stay one short, and
		// nothing would wake it.
		names = slices.DeleteFunc(names, func(name string) bool {
			there := slices.ContainsFunc(owned, named(name)) || slices.ContainsFunc(receiving, named(name))
			if there {
				r.expectations.created(key, name)
			}
			return there
		})
		names = names[:min(len(names), -diff)]
		for len(names) < -diff {
			names = append(names, machineNames.GenerateName(ms.Name+"-"))
		}
		r.expectations.expectCreates(key, names)
		created, err := r.createMachines(ctx, ms, names)
		if created > 0 {
			r.event(ms, corev1.EventTypeNormal, reasonCreated, "Scale", "created %d Machine(s)", created)
		}
		return nil, err

	case diff > 0:
		// A Machine whose deletion may have been stored is chosen again
		// before any other: it counts as deleting.
		unsure := func(m *machinistv1.Machine) bool { return r.expectations.unsureDelete(key, m.UID) }
		victims := pickForDeletion(owned, diff, ms.Spec.DeletePolicy, r.lockedRand(), unsure)
		victims, held, err := r.admitted(ctx, ms, victims)
		if err != nil {
			return nil, err
		}
		var uids []types.UID
		for _, m := range victims {
			if m.DeletionTimestamp.IsZero() {
				uids = append(uids, m.UID)
			}
		}
		if len(uids) == 0 {
			return held, nil
		}
		r.expectations.expectDeletes(key, uids)
		var errs []error
		for _, m := range victims {
			if !m.DeletionTimestamp.IsZero() {
				continue
			}
			// The UID precondition keeps a repeated deletion from ever
			// reaching a new Machine of the same name.
			err := r.Client.Delete(ctx, m, client.Preconditions{UID: &m.UID})
			switch {
			case err == nil:
				r.event(ms, corev1.EventTypeNormal, reasonDeleted, "Scale", "deleting Machine %s (%s)", m.Name, deleteWhy(m, ms.Spec.DeletePolicy))
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
				r.expectations.deleted(key, m.UID) // gone already
			case outcome.Unknown(err):
				r.expectations.deleteUnsure(key, m.UID)
				errs = append(errs, fmt.Errorf("deleting Machine %s (outcome unknown, deleting it again): %w", m.Name, err))
			default:
				r.expectations.deleted(key, m.UID) // refused: not coming
				errs = append(errs, fmt.Errorf("deleting Machine %s: %w", m.Name, err))
			}
		}
		return held, errors.Join(errs...)
	}
	return nil, nil
}

// admitted keeps the victims the disruption budgets let a rollout delete,
// in order, up to the first they refuse: of a set a rollout is emptying,
// each deletion of a Machine in service is a disruption of reason
// Rollout. A refusal is returned as held, which the set's Ready condition
// then says (with an Event when it starts, not on every look).
func (r *Reconciler) admitted(ctx context.Context, ms *machinistv1.MachineSet, victims []*machinistv1.Machine) (kept []*machinistv1.Machine, held *disruption.Refusal, err error) {
	md, rolling := ms.Annotations[machinistv1.RollingOutAnnotation]
	if !rolling || r.APIReader == nil {
		return victims, nil, nil
	}
	store := disruption.Cached(r.APIReader, r.Client)
	for i, m := range victims {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		req := disruption.Request{Machine: m, Reason: machinistv1.DisruptionRollout, By: "machinedeployment/" + md}
		err := store.Admit(ctx, req, disruption.At(r.Calendar))
		if refusal, ok := disruption.AsRefusal(err); ok {
			return victims[:i], refusal, nil
		}
		if err != nil {
			return victims[:i], nil, err
		}
	}
	return victims, nil, nil
}

func (r *Reconciler) lockedRand() *rand.Rand {
	r.rndMu.Lock()
	defer r.rndMu.Unlock()
	return rand.New(rand.NewPCG(r.rnd.Uint64(), r.rnd.Uint64()))
}

func deleteWhy(m *machinistv1.Machine, policy machinistv1.DeletePolicy) string {
	switch deleteRank(m, nil) {
	case 1:
		return "marked with " + machinistv1.DeleteMachineAnnotation
	case 2:
		return "Failed"
	case 3:
		return "not Running and Ready"
	}
	return "delete policy " + string(policy)
}

// createMachines creates the Machines names in growing parallel batches
// and returns how many it created; it stops at the first failing batch.
// A creation whose outcome is unknown is kept to be repeated; one that
// finds its name taken by a Machine of this set (a repeat whose first
// attempt was stored) counts as created.
func (r *Reconciler) createMachines(ctx context.Context, ms *machinistv1.MachineSet, names []string) (int, error) {
	key := client.ObjectKeyFromObject(ms)
	created := 0
	for batch, start := 1, 0; start < len(names); batch = min(batch*2, maxBatch) {
		chunk := names[start:min(start+batch, len(names))]
		start += len(chunk)
		errs := make([]error, len(chunk))
		var wg sync.WaitGroup
		for i, name := range chunk {
			wg.Go(func() { errs[i] = r.create(ctx, ms, name) })
		}
		wg.Wait()
		var failed []error
		for i, err := range errs {
			switch {
			case err == nil:
				created++
			case outcome.Unknown(err):
				r.expectations.createUnsure(key, chunk[i])
				failed = append(failed, fmt.Errorf("creating Machine %s (outcome unknown, creating it again): %w", chunk[i], err))
			default:
				r.expectations.createRefused(key, chunk[i])
				failed = append(failed, err)
			}
		}
		if err := errors.Join(failed...); err != nil {
			for _, name := range names[start:] {
				// Not asked for this time. A name repeated from an
				// earlier unknown outcome stays unsure: that first
				// attempt may still be stored, and forgetting it would
				// fill its slot twice.
				r.expectations.notAttempted(key, name)
			}
			r.event(ms, corev1.EventTypeWarning, reasonCreateFailed, "Scale", "creating Machines: %v", err)
			return created, err
		}
	}
	return created, nil
}

// create creates the Machine name for ms. AlreadyExists is success when the
// Machine there is this set's: an earlier attempt whose reply was lost.
func (r *Reconciler) create(ctx context.Context, ms *machinistv1.MachineSet, name string) error {
	err := r.Client.Create(ctx, newMachine(ms, name))
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	key := types.NamespacedName{Namespace: ms.Namespace, Name: name}
	there := &machinistv1.Machine{}
	if r.Client.Get(ctx, key, there) == nil {
		// The cache has it, so its event has come and gone.
		if ref := metav1.GetControllerOf(there); ref != nil && ref.UID == ms.UID {
			r.expectations.created(client.ObjectKeyFromObject(ms), name)
			return nil
		}
		return err
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	if gerr := reader.Get(ctx, key, there); gerr != nil {
		return errors.Join(err, gerr)
	}
	if ref := metav1.GetControllerOf(there); ref != nil && ref.UID == ms.UID {
		return nil // the cache shows it soon, and its event ends the wait
	}
	return err // a name taken by another: a new one next time
}

// named matches the Machine of that name.
func named(name string) func(*machinistv1.Machine) bool {
	return func(m *machinistv1.Machine) bool { return m.Name == name }
}

// machineNames names Machines as kube-apiserver's generateName would:
// the set's name and five random characters.
var machineNames = generate.SimpleNameGenerator

// newMachine stamps a Machine out of ms's template, owned by ms and with
// the Machine controller's finalizer already on, so that the Machine
// controller need not spend a write adding it.
func newMachine(ms *machinistv1.MachineSet, name string) *machinistv1.Machine {
	t := ms.Spec.Template.DeepCopy()
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       ms.Namespace,
			Labels:          t.Metadata.Labels,
			Annotations:     t.Metadata.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ms, machinistv1.GroupVersion.WithKind("MachineSet"))},
			Finalizers:      []string{machinistv1.MachineFinalizer},
		},
		Spec: t.Spec,
	}
}

// updateStatus writes the observed counts, at most once per StatusInterval
// unless the spec changed, and says when to look again.
func (r *Reconciler) updateStatus(ctx context.Context, ms *machinistv1.MachineSet, owned []*machinistv1.Machine, selector labels.Selector, held *disruption.Refusal) (reconcile.Result, error) {
	now := r.Now()
	want := ptrOr(ms.Spec.Replicas, 1)
	st := ms.Status.DeepCopy()
	pause.Mark(&st.Conditions, pause.Pause{})
	st.Replicas = int32(len(owned))
	st.ReadyReplicas, st.AvailableReplicas = 0, 0
	st.Selector = selector.String()
	var nextAvailable time.Duration
	for _, m := range owned {
		ready, wait := availability(m, ms.Spec.MinReadySeconds, now)
		if ready {
			st.ReadyReplicas++
			if wait <= 0 {
				st.AvailableReplicas++
			} else if nextAvailable == 0 || wait < nextAvailable {
				nextAvailable = wait
			}
		}
	}
	cond := metav1.Condition{Type: machinistv1.ConditionReady, ObservedGeneration: ms.Generation}
	switch {
	case st.Replicas > want && held != nil:
		// Said on the set, where its MachineDeployment's rollout reads it.
		cond.Status, cond.Reason = metav1.ConditionFalse, machinistv1.ReasonDisruptionHeld
		cond.Message = fmt.Sprintf("scaling from %d to %d Machines, waiting: %s", st.Replicas, want, held.Message)
	case st.Replicas != want:
		cond.Status, cond.Reason = metav1.ConditionFalse, machinistv1.ReasonScaling
		cond.Message = fmt.Sprintf("scaling from %d to %d Machines", st.Replicas, want)
	case st.ReadyReplicas < want:
		cond.Status, cond.Reason = metav1.ConditionFalse, machinistv1.ReasonWaitingForMachines
		cond.Message = fmt.Sprintf("%d of %d Machines are Ready", st.ReadyReplicas, want)
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, machinistv1.ReasonAllMachinesReady
		cond.Message = fmt.Sprintf("all %d Machines are Ready", want)
	}
	was := meta.FindStatusCondition(ms.Status.Conditions, machinistv1.ConditionReady)
	startsHeld := cond.Reason == machinistv1.ReasonDisruptionHeld && (was == nil || was.Reason != machinistv1.ReasonDisruptionHeld)
	meta.SetStatusCondition(&st.Conditions, cond)
	st.ObservedGeneration = ms.Generation

	res := reconcile.Result{RequeueAfter: nextAvailable}
	if equality.Semantic.DeepEqual(st, &ms.Status) {
		return res, nil
	}
	if wait := r.statusWait(ms, now); wait > 0 && ms.Status.ObservedGeneration == ms.Generation {
		if res.RequeueAfter == 0 || wait < res.RequeueAfter {
			res.RequeueAfter = wait
		}
		return res, nil
	}
	// A patch, not an update: the status is this controller's alone, but
	// its MachineDeployment resizes the set (spec) many times a second in
	// a rollout, and an update read before such a resize would be refused
	// for no fault of its own. The cache is never older than this
	// controller's own last acknowledged status write (writes), so the
	// patch's base holds what it last wrote; a write whose reply was lost
	// or that was stored late is set right by statusNotMine.
	base := ms.DeepCopy()
	ms.Status = *st
	key := client.ObjectKeyFromObject(ms)
	r.statuses.Store(key, *stored(st))
	if err := r.Client.Status().Patch(ctx, ms, client.MergeFrom(base)); err != nil {
		return res, err
	}
	r.statuses.Store(key, ms.Status)
	r.wrote(ms, now)
	r.writes.Wrote(ms)
	if startsHeld {
		// Once per hold, when it is stored, not on every look.
		r.event(ms, corev1.EventTypeNormal, machinistv1.ReasonDisruptionHeld, "Scale", "not deleting Machines yet: %s", held.Message)
	}
	return res, nil
}

// paused does nothing for a paused set but say so, once: no Machine is
// adopted, released, made or deleted, and its counts stay as they were.
func (r *Reconciler) paused(ctx context.Context, ms *machinistv1.MachineSet, p pause.Pause) error {
	st := ms.Status.DeepCopy()
	if !pause.Mark(&st.Conditions, p) {
		return nil
	}
	base := ms.DeepCopy()
	ms.Status = *st
	key := client.ObjectKeyFromObject(ms)
	r.statuses.Store(key, *stored(st))
	if err := r.Client.Status().Patch(ctx, ms, client.MergeFrom(base)); err != nil {
		return err
	}
	r.statuses.Store(key, ms.Status)
	r.writes.Wrote(ms)
	r.event(ms, corev1.EventTypeNormal, machinistv1.ConditionPaused, "Pause", "%s", p.Message)
	return nil
}

// statusNotMine passes an update of a set's status to anything but what
// this controller last wrote or tried to write: a write of its own that
// was answered 504 and stored later, over a newer one, or a lost reply's
// write under a patch computed from a cache that did not show it yet.
// The controller's own writes, as they come back, pass nothing.
func (r *Reconciler) statusNotMine() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*machinistv1.MachineSet)
		ms, ok2 := e.ObjectNew.(*machinistv1.MachineSet)
		if !ok1 || !ok2 || equality.Semantic.DeepEqual(old.Status, ms.Status) {
			return false
		}
		mine, ok := r.statuses.Load(client.ObjectKeyFromObject(ms))
		return !ok || !equality.Semantic.DeepEqual(mine, ms.Status)
	}}
}

// stored is st as kube-apiserver stores it: times to the second.
func stored(st *machinistv1.MachineSetStatus) *machinistv1.MachineSetStatus {
	out := st.DeepCopy()
	for i := range out.Conditions {
		out.Conditions[i].LastTransitionTime = out.Conditions[i].LastTransitionTime.Rfc3339Copy()
	}
	return out
}

// availability reports whether m is Running and Ready and how long until
// it has been Ready for minReadySeconds.
func availability(m *machinistv1.Machine, minReadySeconds int32, now time.Time) (bool, time.Duration) {
	if !m.DeletionTimestamp.IsZero() || m.Status.Phase != machinistv1.MachineRunning {
		return false, 0
	}
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, 0
	}
	return true, c.LastTransitionTime.Add(time.Duration(minReadySeconds) * time.Second).Sub(now)
}

func (r *Reconciler) statusWait(ms *machinistv1.MachineSet, now time.Time) time.Duration {
	return r.statusWaitOf(client.ObjectKeyFromObject(ms), now)
}

// statusWaitOf is statusWait by the set's key; zero or less when its
// status may be written now.
func (r *Reconciler) statusWaitOf(key types.NamespacedName, now time.Time) time.Duration {
	v, ok := r.lastWrite.Load(key)
	if !ok {
		return 0
	}
	return v.(time.Time).Add(r.statusInterval()).Sub(now)
}

func (r *Reconciler) statusInterval() time.Duration {
	if r.StatusInterval <= 0 {
		return time.Second
	}
	return r.StatusInterval
}

func (r *Reconciler) wrote(ms *machinistv1.MachineSet, now time.Time) {
	r.lastWrite.Store(client.ObjectKeyFromObject(ms), now)
}

func (r *Reconciler) event(ms *machinistv1.MachineSet, kind, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(ms, nil, kind, reason, action, format, args...)
	}
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

var _ handler.EventHandler = &machineHandler{}

// machineHandler turns Machine events into MachineSet reconciles and marks
// expected creations and deletions as seen.
type machineHandler struct{ r *Reconciler }

func (h *machineHandler) Create(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	m := e.Object.(*machinistv1.Machine)
	if key, ok := owner(m); ok {
		h.r.expectations.created(key, m.Name)
		h.wake(q, key, !h.r.expectations.awaiting(key))
		return
	}
	h.enqueueMatching(ctx, m, q)
}

func (h *machineHandler) Update(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	old, m := e.ObjectOld.(*machinistv1.Machine), e.ObjectNew.(*machinistv1.Machine)
	oldKey, hadOwner := owner(old)
	key, hasOwner := owner(m)
	deleting := hasOwner && old.DeletionTimestamp.IsZero() && !m.DeletionTimestamp.IsZero()
	if deleting {
		h.r.expectations.deleted(key, m.UID)
	}
	moved := hadOwner && (!hasOwner || oldKey != key)
	if moved {
		q.Add(reconcile.Request{NamespacedName: oldKey})
	}
	if hasOwner {
		// A change of status or spec alone changes only what the set
		// counts for its status, written at most once a second anyway.
		urgent := moved || (deleting && !h.r.expectations.awaiting(key)) || !maps.Equal(old.Labels, m.Labels)
		h.wake(q, key, urgent)
		return
	}
	h.enqueueMatching(ctx, m, q)
}

func (h *machineHandler) Delete(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	m, ok := e.Object.(*machinistv1.Machine)
	if !ok {
		return
	}
	if key, ok := owner(m); ok {
		h.r.expectations.deleted(key, m.UID)
		h.wake(q, key, !h.r.expectations.awaiting(key))
	}
}

func (h *machineHandler) Generic(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
}

// wake queues key at once when urgent, else paced.
func (h *machineHandler) wake(q workqueue.TypedRateLimitingInterface[reconcile.Request], key types.NamespacedName, urgent bool) {
	if urgent {
		q.Add(reconcile.Request{NamespacedName: key})
		return
	}
	// What is not urgent changes only what the set counts, and so only its
	// status, which may not be written again before StatusInterval has
	// passed since the last write: a look sooner would find the same and
	// write nothing. At 10,000 Machines the spacing alone allowed five
	// looks a second, one of which could write. Bounded by the interval,
	// since the wait is read on the reconciler's clock, which a test may
	// stop, and the queue waits by the real one.
	h.r.pacer.AddNoSooner(q, key, min(h.r.statusWaitOf(key, h.r.Now()), h.r.statusInterval()))
}

// enqueueMatching queues every MachineSet whose selector matches an orphan.
func (h *machineHandler) enqueueMatching(ctx context.Context, m *machinistv1.Machine, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if !m.DeletionTimestamp.IsZero() {
		return
	}
	var sets machinistv1.MachineSetList
	if err := h.r.Client.List(ctx, &sets, client.InNamespace(m.Namespace)); err != nil {
		log.FromContext(ctx).Error(err, "listing MachineSets for an orphan Machine", "machine", m.Name)
		return
	}
	for i := range sets.Items {
		sel, err := metav1.LabelSelectorAsSelector(sets.Items[i].Spec.Selector.AsMeta())
		if err == nil && sel.Matches(labels.Set(m.Labels)) {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sets.Items[i])})
		}
	}
}

func owner(m *machinistv1.Machine) (types.NamespacedName, bool) {
	ref := metav1.GetControllerOf(m)
	if ref == nil || ref.Kind != "MachineSet" || ref.APIVersion != machinistv1.GroupVersion.String() {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, true
}
