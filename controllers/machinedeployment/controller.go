package machinedeployment

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/pace"
	"github.com/machinist-dev/machinist/internal/patch"
	"github.com/machinist-dev/machinist/internal/requeue"
	"github.com/machinist-dev/machinist/internal/stale"
	"github.com/machinist-dev/machinist/internal/wake"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/providers"
)

// Reconciler is the MachineDeployment controller.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Recorder emits an Event per rollout transition.
	Recorder events.EventRecorder
	// Transitions counts rollout transitions by from, to and event; nil
	// counts none.
	Transitions *prometheus.CounterVec
	// Actuators say which changes an InPlace rollout can apply in place;
	// without them none can.
	Actuators *providers.Registry
	// APIReader reads past the cache: the disruption budgets an expiry
	// asks before it replaces a Machine. Nil asks none.
	APIReader client.Reader
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Calendar is the clock the disruption budgets are asked on: their
	// windows open and close on it. Nil means time.Now.
	Calendar func() time.Time
	// PerMachine paces the reconciles that its Machines' changes ask
	// for: a MachineDeployment of N Machines is looked at no more than
	// once per N × PerMachine for them (see package pace). Zero means
	// pace.DefaultPerObject. A Machine's deletion wakes it at once.
	PerMachine time.Duration

	pacer pace.Pacer
	// expiryHolds remembers, by MachineDeployment UID, which budget an
	// expiry's hold was last said for.
	expiryHolds sync.Map
	// writes keeps a reconcile from acting on a cached MachineDeployment
	// older than its own last status write (a set's event wakes it
	// milliseconds after it): it would fire a rollout move already stored,
	// and the write would be refused.
	writes stale.Writes
	// setWrites does the same for the MachineSets it resizes: each resize
	// is tested on the set's generation, so a plan made from a cached set
	// older than its own last resize would be refused (and a merge patch
	// would undo it).
	setWrites stale.Writes
	// cache is the manager's cache, whose index of Machines by controller
	// counts reads; nil lists the namespace through Client.
	cache cache.Cache
}

// NewTransitionsMetric returns the rollout transitions counter.
func NewTransitionsMetric() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "machinist_rollout_transitions_total",
		Help: "MachineDeployment rollout transitions, by from phase, to phase and event.",
	}, []string{"from", "to", "event"})
	// Every move of the table is served from the start, at zero (see
	// lifecycle.NewMetrics).
	for _, r := range Rollout.Rules {
		for _, from := range r.From {
			c.WithLabelValues(string(from), string(r.To), string(r.Event))
		}
	}
	return c
}

// SetupWithManager registers the controller and its watches.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := index.Register(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	r.cache = mgr.GetCache()
	// The pacer keeps real time, as the work queue's delays do.
	r.pacer.PerObject = r.PerMachine
	return ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.MachineDeployment{}, builder.WithPredicates(wake.OnChangeByOthers())).
		Owns(&machinistv1.MachineSet{}).
		// A Machine deleted by hand changes no MachineSet status (it still
		// counts until gone), but OnDelete rollouts act on it.
		Watches(&machinistv1.Machine{}, r.machineChanged()).
		// A class's Nodes are what its deployments publish.
		Watches(&machinistv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.deploymentsOfClass),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(opts).
		Named("machinedeployment").
		Complete(r)
}

// machineChanged wakes a Machine's MachineDeployment: at once when the
// Machine starts going or is gone, paced otherwise. The rest of a
// Machine's changes (its phase, its Ready condition) change what the
// deployment counts, which a look a few milliseconds later counts too.
// A deployment with a single MachineSet in use is not woken for them:
// counts only decide how its sets trade Machines in a rollout, and its
// status is the sets' status, whose writes wake it.
func (r *Reconciler) machineChanged() handler.TypedEventHandler[client.Object, reconcile.Request] {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	wake := func(ctx context.Context, o client.Object, q queue, urgent bool) {
		key, uid, ok := r.deploymentOf(ctx, o)
		switch {
		case !ok:
		case urgent:
			q.Add(reconcile.Request{NamespacedName: key})
		case r.soleSet(ctx, key.Namespace, uid):
		default:
			r.pacer.Add(q, key)
		}
	}
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { wake(ctx, e.Object, q, false) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			going := e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
			if was, is := metav1.GetControllerOf(e.ObjectOld), metav1.GetControllerOf(e.ObjectNew); was != nil && (is == nil || is.UID != was.UID) {
				wake(ctx, e.ObjectOld, q, true) // released: its old set's deployment counts one fewer
			}
			wake(ctx, e.ObjectNew, q, going)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) { wake(ctx, e.Object, q, true) },
	}
}

// soleSet says whether the deployment of UID uid in namespace ns has one
// MachineSet that has or may have Machines and it is its newest revision:
// no rollout is under way, in which the sets would trade Machines. The
// empty sets kept for rollbacks do not count; an in-place rollout's new
// set, empty at first, is newer than the set in use. Read from the cache
// without copies: a few sets, for each change of a Machine. When unsure
// it says no, which paces the wake-up.
func (r *Reconciler) soleSet(ctx context.Context, ns string, uid types.UID) bool {
	var list machinistv1.MachineSetList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	inUse, newest := 0, int64(-1)
	var used *machinistv1.MachineSet
	for i := range list.Items {
		ms := &list.Items[i]
		if ref := metav1.GetControllerOfNoCopy(ms); ref == nil || ref.UID != uid {
			continue
		}
		newest = max(newest, revision(ms))
		if ptrOr(ms.Spec.Replicas) > 0 || ms.Status.Replicas > 0 {
			inUse++
			used = ms
		}
	}
	return inUse == 1 && revision(used) == newest
}

// deploymentOf names the MachineDeployment whose MachineSet controls o,
// and gives its UID.
func (r *Reconciler) deploymentOf(ctx context.Context, o client.Object) (types.NamespacedName, types.UID, bool) {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "MachineSet" {
		return types.NamespacedName{}, "", false
	}
	ms := &machinistv1.MachineSet{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}, ms); err != nil {
		return types.NamespacedName{}, "", false
	}
	if md := metav1.GetControllerOf(ms); md != nil && md.Kind == "MachineDeployment" {
		return types.NamespacedName{Namespace: ms.Namespace, Name: md.Name}, md.UID, true
	}
	return types.NamespacedName{}, "", false
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// TemplateHash names a template: equal templates hash equally, so applying
// an earlier template finds that revision's MachineSet again.
func TemplateHash(t machinistv1.MachineTemplateSpec) string {
	data, _ := json.Marshal(t) // a plain struct always marshals
	h := fnv.New32a()
	h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10))
}

// currentSet is the set of md's current template among sets: the one
// named by its hash, else the newest whose template is equal but for the
// hash label. The hash is of the template's Go form, which an API version
// may change (v1beta1's taints are not v1alpha1's): a set made by an
// earlier release, whose label is the hash it computed, is still the
// current one, and an upgrade replaces no Machine. Kubernetes' Deployment
// controller finds its ReplicaSets the same way for the same reason.
func currentSet(md *machinistv1.MachineDeployment, sets []*machinistv1.MachineSet, hash string) *machinistv1.MachineSet {
	for _, ms := range sets {
		if ms.Labels[machinistv1.TemplateHashLabel] == hash {
			return ms
		}
	}
	// No label matches: an earlier release's set keeps the label it was
	// given, so an upgraded deployment looks here at every reconcile
	// until its template next changes (a comparison per set, copying
	// only the labels).
	var equal *machinistv1.MachineSet
	for _, ms := range sets {
		if (equal == nil || revision(ms) > revision(equal)) && equalIgnoringHash(ms.Spec.Template, md.Spec.Template) {
			equal = ms
		}
	}
	return equal
}

// equalIgnoringHash says whether two templates are equal but for the
// template hash label.
func equalIgnoringHash(a, b machinistv1.MachineTemplateSpec) bool {
	la, lb := maps.Clone(a.Metadata.Labels), maps.Clone(b.Metadata.Labels)
	delete(la, machinistv1.TemplateHashLabel)
	delete(lb, machinistv1.TemplateHashLabel)
	return equality.Semantic.DeepEqual(la, lb) && equality.Semantic.DeepEqual(a.Metadata.Annotations, b.Metadata.Annotations) &&
		equality.Semantic.DeepEqual(a.Spec, b.Spec)
}

func revision(o metav1.Object) int64 {
	v, _ := strconv.ParseInt(o.GetAnnotations()[machinistv1.RevisionAnnotation], 10, 64)
	return v
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return requeue.Expected(r.reconcile(ctx, req))
}

func (r *Reconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	md := &machinistv1.MachineDeployment{}
	if err := r.Client.Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			r.writes.Forget(req.NamespacedName)
			r.pacer.Forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if r.writes.Stale(ctx, r.APIReader, md) {
		return reconcile.Result{RequeueAfter: stale.Recheck}, nil
	}
	if !md.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	if p := pause.Of(md, "MachineDeployment"); p.Paused() {
		return reconcile.Result{}, r.paused(ctx, md, p)
	}
	sets, err := r.ownedSets(ctx, md)
	if err != nil {
		return reconcile.Result{}, err
	}
	for _, ms := range sets {
		if r.setWrites.Stale(ctx, r.APIReader, ms) {
			return reconcile.Result{RequeueAfter: stale.Recheck}, nil
		}
	}
	hash := TemplateHash(md.Spec.Template)
	newSet := currentSet(md, sets, hash)
	var old []*machinistv1.MachineSet
	for _, ms := range sets {
		if ms != newSet {
			old = append(old, ms)
		}
	}
	slices.SortStableFunc(old, func(a, b *machinistv1.MachineSet) int { return int(revision(a) - revision(b)) })
	maxOld := int64(0)
	for _, ms := range old {
		maxOld = max(maxOld, revision(ms))
	}

	if !md.Spec.Paused {
		switch {
		case newSet == nil:
			if newSet, err = r.createSet(ctx, md, hash, maxOld+1); err != nil {
				return reconcile.Result{}, err
			}
		case revision(newSet) <= maxOld:
			// A rollback to an earlier template: its set becomes the newest
			// revision again instead of a copy being made.
			// Tested on the revision it replaces: a rollback stored late,
			// after a later one, must not give the set an old revision.
			patched := newSet.DeepCopy()
			patched.Annotations[machinistv1.RevisionAnnotation] = strconv.FormatInt(maxOld+1, 10)
			var p patch.JSON
			key := "/metadata/annotations/" + patch.Key(machinistv1.RevisionAnnotation)
			p.Test(key, newSet.Annotations[machinistv1.RevisionAnnotation])
			p.Set(key, patched.Annotations[machinistv1.RevisionAnnotation])
			patched.Annotations[machinistv1.DeploymentRevisionAnnotation] = patched.Annotations[machinistv1.RevisionAnnotation]
			p.Set("/metadata/annotations/"+patch.Key(machinistv1.DeploymentRevisionAnnotation), patched.Annotations[machinistv1.RevisionAnnotation])
			if cause, ok := md.Annotations[machinistv1.ChangeCauseAnnotation]; ok {
				patched.Annotations[machinistv1.ChangeCauseAnnotation] = cause
				p.Set("/metadata/annotations/"+patch.Key(machinistv1.ChangeCauseAnnotation), cause)
			}
			if err := r.Client.Patch(ctx, patched, p.Patch()); err != nil {
				return reconcile.Result{}, patch.Conflict(err)
			}
			r.setWrites.Wrote(patched)
			newSet = patched
			r.event(md, corev1.EventTypeNormal, "RolledBack", "Rollback", "template of revision %d is current again", revision(newSet))
		}
	}
	// Oldest first, the newest last; a paused deployment may not have a set
	// of its current template yet.
	ordered := slices.Clone(old)
	if newSet != nil {
		ordered = append(ordered, newSet)
	}
	if err := r.nameSets(ctx, md, ordered); err != nil {
		return reconcile.Result{}, err
	}
	// Retried with the reconcile's error, but never in the way of the
	// rollout and the scaling.
	publishErr := r.publish(ctx, md)
	var mode inPlaceMode
	var held string
	if md.Spec.Strategy.Type == machinistv1.InPlaceStrategy && newSet != nil {
		if mode, err = r.mode(ctx, md, old); err != nil {
			return reconcile.Result{}, err
		}
		if !md.Spec.Paused && !mode.replace && mode.blocked == "" {
			if held, err = r.inPlace(ctx, md, newSet, old); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	if err := r.scale(ctx, md, ordered, md.Spec.Paused, mode); err != nil {
		return reconcile.Result{}, err
	}
	if !md.Spec.Paused {
		if err := r.pruneHistory(ctx, md, old); err != nil {
			return reconcile.Result{}, err
		}
	}
	res, err := r.updateStatus(ctx, md, newSet, old, mode.blocked, held)
	if err != nil {
		return res, err
	}
	wait, err := r.expire(ctx, md, newSet, old)
	if wait > 0 && (res.RequeueAfter == 0 || wait < res.RequeueAfter) {
		res.RequeueAfter = wait
	}
	return res, errors.Join(publishErr, err)
}

func (r *Reconciler) ownedSets(ctx context.Context, md *machinistv1.MachineDeployment) ([]*machinistv1.MachineSet, error) {
	var list machinistv1.MachineSetList
	if err := r.Client.List(ctx, &list, client.InNamespace(md.Namespace)); err != nil {
		return nil, err
	}
	var out []*machinistv1.MachineSet
	for i := range list.Items {
		if ref := metav1.GetControllerOf(&list.Items[i]); ref != nil && ref.UID == md.UID {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// createSet makes the MachineSet of md's current template, empty: the
// planner sizes it.
func (r *Reconciler) createSet(ctx context.Context, md *machinistv1.MachineDeployment, hash string, rev int64) (*machinistv1.MachineSet, error) {
	template := *md.Spec.Template.DeepCopy()
	template.Metadata.Labels = withLabel(template.Metadata.Labels, machinistv1.TemplateHashLabel, hash)
	selector := *md.Spec.Selector.DeepCopy()
	selector.MatchLabels = withLabel(selector.MatchLabels, machinistv1.TemplateHashLabel, hash)
	ms := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: md.Namespace,
			Name:      md.Name + "-" + hash,
			Labels:    setLabelsAtCreation(md, hash),
			Annotations: map[string]string{
				machinistv1.RevisionAnnotation:           strconv.FormatInt(rev, 10),
				machinistv1.DeploymentRevisionAnnotation: strconv.FormatInt(rev, 10),
				machinistv1.DesiredReplicasAnnotation:    strconv.Itoa(int(replicasOf(md))),
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(md, machinistv1.GroupVersion.WithKind("MachineDeployment"))},
		},
		Spec: machinistv1.MachineSetSpec{
			Replicas:        new(int32),
			Selector:        selector,
			Template:        template,
			MinReadySeconds: md.Spec.MinReadySeconds,
			DeletePolicy:    machinistv1.DeleteOldest,
		},
	}
	if cause, ok := md.Annotations[machinistv1.ChangeCauseAnnotation]; ok {
		ms.Annotations[machinistv1.ChangeCauseAnnotation] = cause
	}
	err := r.Client.Create(ctx, ms)
	if apierrors.IsAlreadyExists(err) {
		// Made by an earlier reconcile whose write the cache has not shown.
		err = r.Client.Get(ctx, client.ObjectKeyFromObject(ms), ms)
	}
	if err != nil {
		return nil, fmt.Errorf("creating MachineSet for revision %d: %w", rev, err)
	}
	r.event(md, corev1.EventTypeNormal, "MachineSetCreated", "RollOut", "created MachineSet %s for revision %d", ms.Name, rev)
	return ms, nil
}

func withLabel(labels map[string]string, k, v string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}

func replicasOf(md *machinistv1.MachineDeployment) int32 {
	if md.Spec.Replicas == nil {
		return 1
	}
	return *md.Spec.Replicas
}

// counts gathers what the planner needs to know of each set.
func (r *Reconciler) counts(ctx context.Context, md *machinistv1.MachineDeployment, sets ...*machinistv1.MachineSet) (map[types.UID]*Set, error) {
	out := map[types.UID]*Set{}
	for _, ms := range sets {
		out[ms.UID] = &Set{Name: ms.Name, Replicas: ptrOr(ms.Spec.Replicas)}
	}
	// Availability comes from the Machines themselves, not from the sets'
	// status: a set writes its status at most once a second, and a stale
	// count would let the planner remove Machines it must keep.
	now := r.now()
	minReady := time.Duration(md.Spec.MinReadySeconds) * time.Second
	read := 0
	defer func() { r.pacer.Looked(client.ObjectKeyFromObject(md), read) }()
	for _, ms := range sets {
		// The cache's own objects, by index: read, never modified.
		machines, err := index.Machines(ctx, r.Client, r.cache, md.Namespace, string(ms.UID))
		if err != nil {
			return nil, err
		}
		s := out[ms.UID]
		read += len(machines)
		for _, m := range machines {
			s.Machines++
			if m.DeletionTimestamp.IsZero() {
				s.Live++
				if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); m.Status.Phase == machinistv1.MachineRunning &&
					c != nil && c.Status == metav1.ConditionTrue && !now.Before(c.LastTransitionTime.Add(minReady)) {
					s.Available++
				}
			}
		}
	}
	return out, nil
}

func ptrOr(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// scale sizes the sets (oldest first, the newest last): in proportion when
// spec.replicas changed, else, unless paused, by one planner step.
func (r *Reconciler) scale(ctx context.Context, md *machinistv1.MachineDeployment, ordered []*machinistv1.MachineSet, paused bool, mode inPlaceMode) error {
	if len(ordered) == 0 {
		return nil
	}
	counts, err := r.counts(ctx, md, ordered...)
	if err != nil {
		return err
	}
	strategy, err := Resolve(md.Spec.Strategy, replicasOf(md))
	if err != nil {
		return reconcile.TerminalError(err)
	}
	if mode.replace {
		// The fallback: what cannot change in place is replaced, within
		// the in-place bound, without surging.
		strategy.Type = machinistv1.RollingUpdateStrategy
	}
	all := make([]Set, 0, len(ordered))
	for _, ms := range ordered {
		all = append(all, *counts[ms.UID])
	}
	var plan Plan
	if scalingEvent(md, ordered) {
		plan = Proportional(replicasOf(md), strategy, all)
	}
	// A resize in proportion is the owner's scaling, not a rollout's
	// disruption.
	stepping := plan == nil
	if plan == nil && !paused && mode.blocked == "" {
		plan = Next(replicasOf(md), strategy, all[len(all)-1], all[:len(all)-1])
	}
	desired := strconv.Itoa(int(replicasOf(md)))
	var errs []error
	for i, ms := range ordered {
		n, ok := plan[ms.Name]
		// An old set the rollout shrinks deletes its Machines under the
		// disruption budgets; the newest is never emptied by a rollout.
		rolling := stepping && ok && i < len(ordered)-1 && n < ptrOr(ms.Spec.Replicas) && ms.Annotations[machinistv1.RollingOutAnnotation] != md.Name
		if (!ok || n == ptrOr(ms.Spec.Replicas)) && ms.Annotations[machinistv1.DesiredReplicasAnnotation] == desired {
			continue
		}
		if !ok && paused {
			continue // a paused deployment only resizes in proportion
		}
		patched := ms.DeepCopy()
		if ok {
			patched.Spec.Replicas = &n
		}
		if patched.Annotations == nil {
			patched.Annotations = map[string]string{}
		}
		patched.Annotations[machinistv1.DesiredReplicasAnnotation] = desired
		if rolling {
			patched.Annotations[machinistv1.RollingOutAnnotation] = md.Name
		}
		if err := r.Client.Patch(ctx, patched, resize(ms, patched)); err != nil {
			errs = append(errs, fmt.Errorf("scaling MachineSet %s: %w", ms.Name, patch.Conflict(err)))
			continue
		}
		r.setWrites.Wrote(patched)
		if ok && n != ptrOr(ms.Spec.Replicas) {
			r.event(md, corev1.EventTypeNormal, "Scaled", "RollOut", "scaled MachineSet %s from %d to %d", ms.Name, ptrOr(ms.Spec.Replicas), n)
		}
		*ms = *patched
	}
	return errors.Join(errs...)
}

// resize is the patch from ms to patched: its size and annotations, on
// the condition that its spec is still the one the plan was made from (its
// generation). The plan's sizes are absolute and computed from every set's
// size at once; written over a size that someone changed since (a resize
// of the deployment's own stored late after a 504, a user's scale, the
// in-place hand-over's count), they would undo it, and overshoot maxSurge
// or maxUnavailable. A set's status writes change its resourceVersion,
// not its generation, so they never refuse a resize.
func resize(ms, patched *machinistv1.MachineSet) client.Patch {
	var p patch.JSON
	p.Test("/metadata/generation", ms.Generation)
	if r := patched.Spec.Replicas; r != nil && (ms.Spec.Replicas == nil || *r != *ms.Spec.Replicas) {
		p.Set("/spec/replicas", *r)
	}
	if ms.Annotations == nil {
		p.Set("/metadata/annotations", patched.Annotations)
		return p.Patch()
	}
	for k, v := range patched.Annotations {
		if have, ok := ms.Annotations[k]; !ok || have != v {
			p.Set("/metadata/annotations/"+patch.Key(k), v)
		}
	}
	return p.Patch()
}

// heldBy says which old set a disruption budget holds back, and why; ""
// when none.
func heldBy(old []*machinistv1.MachineSet) string {
	for _, ms := range old {
		if c := meta.FindStatusCondition(ms.Status.Conditions, machinistv1.ConditionReady); c != nil && c.Reason == machinistv1.ReasonDisruptionHeld {
			return fmt.Sprintf("MachineSet %s is %s", ms.Name, c.Message)
		}
	}
	return ""
}

// scalingEvent reports whether spec.replicas changed since the sets with
// Machines were last sized.
func scalingEvent(md *machinistv1.MachineDeployment, sets []*machinistv1.MachineSet) bool {
	desired := strconv.Itoa(int(replicasOf(md)))
	for _, ms := range sets {
		if ptrOr(ms.Spec.Replicas) > 0 {
			if v, ok := ms.Annotations[machinistv1.DesiredReplicasAnnotation]; ok && v != desired {
				return true
			}
		}
	}
	return false
}

// pruneHistory deletes empty old sets beyond revisionHistoryLimit, oldest
// first.
func (r *Reconciler) pruneHistory(ctx context.Context, md *machinistv1.MachineDeployment, old []*machinistv1.MachineSet) error {
	limit := 10
	if md.Spec.RevisionHistoryLimit != nil {
		limit = int(*md.Spec.RevisionHistoryLimit)
	}
	var empty []*machinistv1.MachineSet
	for _, ms := range old {
		if ptrOr(ms.Spec.Replicas) == 0 && ms.Status.Replicas == 0 && ms.DeletionTimestamp.IsZero() {
			empty = append(empty, ms)
		}
	}
	for _, ms := range empty[:max(0, len(empty)-limit)] {
		if err := r.Client.Delete(ctx, ms); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// updateStatus writes counts, conditions and the rollout phase, which
// moves only by the events Decide chooses from what it observes.
func (r *Reconciler) updateStatus(ctx context.Context, md *machinistv1.MachineDeployment, newSet *machinistv1.MachineSet, old []*machinistv1.MachineSet, blocked, held string) (reconcile.Result, error) {
	now := r.now()
	replicas := replicasOf(md)
	st := md.Status.DeepCopy()
	pause.Mark(&st.Conditions, pause.Pause{})
	st.Replicas, st.ReadyReplicas, st.AvailableReplicas, st.UpdatedReplicas = 0, 0, 0, 0
	for _, ms := range append(slices.Clone(old), newSet) {
		if ms == nil {
			continue
		}
		st.Replicas += ms.Status.Replicas
		st.ReadyReplicas += ms.Status.ReadyReplicas
		st.AvailableReplicas += ms.Status.AvailableReplicas
	}
	newAvailable := int32(0)
	if newSet != nil {
		st.UpdatedReplicas = newSet.Status.Replicas
		newAvailable = newSet.Status.AvailableReplicas
	}
	st.UnavailableReplicas = max(0, replicas-st.AvailableReplicas)
	if sel, err := metav1.LabelSelectorAsSelector(md.Spec.Selector.AsMeta()); err == nil {
		st.Selector = sel.String()
	}
	st.ObservedGeneration = md.Generation

	complete := newSet != nil && newAvailable == replicas && st.UpdatedReplicas == replicas && st.Replicas == replicas
	progressed := st.UpdatedReplicas != md.Status.UpdatedReplicas || st.AvailableReplicas != md.Status.AvailableReplicas ||
		st.Replicas != md.Status.Replicas || md.Status.ObservedGeneration != md.Generation
	if progressed || st.LastProgressTime == nil {
		st.LastProgressTime = &metav1.Time{Time: now}
	}
	deadline := time.Duration(600) * time.Second
	if md.Spec.ProgressDeadlineSeconds != nil {
		deadline = time.Duration(*md.Spec.ProgressDeadlineSeconds) * time.Second
	}
	from := st.Phase
	if from == "" {
		from = Rollout.Initial
	}
	if !slices.Contains(Rollout.States(), from) {
		return reconcile.Result{}, fmt.Errorf("the rollout table has no phase %s", from)
	}
	fsm := Rollout.New(from)
	var fired [][3]string
	for _, e := range Decide(from, Facts{Paused: md.Spec.Paused, Complete: complete, DeadlinePassed: now.Sub(st.LastProgressTime.Time) >= deadline}) {
		f, t, err := fsm.Fire(e)
		if err != nil {
			return reconcile.Result{}, err
		}
		fired = append(fired, [3]string{string(f), string(t), string(e)})
	}
	st.Phase = fsm.State()

	progressing := metav1.Condition{Type: machinistv1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonRollingOut,
		Message: fmt.Sprintf("%d of %d Machines updated, %d available", st.UpdatedReplicas, replicas, st.AvailableReplicas), ObservedGeneration: md.Generation}
	switch st.Phase {
	case machinistv1.RolloutStable:
		progressing.Reason, progressing.Message = machinistv1.ReasonNewMachineSetAvailable, fmt.Sprintf("MachineSet %s is available", newSet.Name)
	case machinistv1.RolloutPaused:
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionUnknown, machinistv1.ReasonPaused, "the rollout is paused"
	case machinistv1.RolloutStalled:
		progressing.Status, progressing.Reason = metav1.ConditionFalse, machinistv1.ReasonProgressDeadlineExceeded
		progressing.Message = fmt.Sprintf("no progress for %s: %s", deadline, progressing.Message)
	}
	if why := cmp.Or(heldBy(old), held); why != "" && st.Phase == machinistv1.RolloutProgressing {
		progressing.Reason, progressing.Message = machinistv1.ReasonDisruptionHeld, why
	}
	if blocked != "" && (st.Phase == machinistv1.RolloutProgressing || st.Phase == machinistv1.RolloutStalled) {
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionFalse, machinistv1.ReasonInPlaceNotPossible, blocked
	}
	meta.SetStatusCondition(&st.Conditions, progressing)
	strategy, _ := Resolve(md.Spec.Strategy, replicas)
	available := metav1.Condition{Type: machinistv1.ConditionAvailable, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonBelowMinimum, ObservedGeneration: md.Generation,
		Message: fmt.Sprintf("%d available, %d needed", st.AvailableReplicas, replicas-strategy.MaxUnavailable)}
	if st.AvailableReplicas >= replicas-strategy.MaxUnavailable {
		available.Status, available.Reason = metav1.ConditionTrue, machinistv1.ReasonMinimumAvailable
	}
	meta.SetStatusCondition(&st.Conditions, available)

	var res reconcile.Result
	if st.Phase == machinistv1.RolloutProgressing {
		res.RequeueAfter = st.LastProgressTime.Add(deadline).Sub(now) + time.Second
	}
	if equality.Semantic.DeepEqual(st, &md.Status) {
		return res, nil
	}
	md.Status = *st
	if err := r.Client.Status().Update(ctx, md); err != nil {
		// A conflict is retried by Reconcile (requeue.Expected).
		return res, err
	}
	r.writes.Wrote(md)
	for _, t := range fired {
		if r.Transitions != nil {
			r.Transitions.WithLabelValues(t[0], t[1], t[2]).Inc()
		}
		r.event(md, corev1.EventTypeNormal, "Rollout"+t[1], t[1], "%s -> %s (%s)", t[0], t[1], t[2])
	}
	return res, nil
}

// paused does nothing for a paused deployment but say so, once: no set
// is made, scaled or retired, and its rollout stays where it was, unlike
// spec.paused, which freezes the rollout but still scales.
func (r *Reconciler) paused(ctx context.Context, md *machinistv1.MachineDeployment, p pause.Pause) error {
	if !pause.Mark(&md.Status.Conditions, p) {
		return nil
	}
	if err := r.Client.Status().Update(ctx, md); err != nil {
		return err
	}
	r.writes.Wrote(md)
	r.event(md, corev1.EventTypeNormal, machinistv1.ConditionPaused, "Pause", "%s", p.Message)
	return nil
}

func (r *Reconciler) event(md *machinistv1.MachineDeployment, kind, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(md, nil, kind, reason, action, format, args...)
	}
}
