// Package workloadcluster is the WorkloadCluster controller: it says
// whether each cluster is reachable, through the connection package
// clusters keeps, and whether machines can join it (joinable.go), and
// holds a WorkloadCluster's deletion until no Machine serves it.
package workloadcluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/nodes"
)

// DefaultProbePeriod is how often a connected cluster is asked its version
// and counted, and its Secret read again (a rotated kubeconfig is picked
// up then). It also bounds how often a WorkloadCluster's status changes
// for counts alone: at most one write per period.
const DefaultProbePeriod = 30 * time.Second

// DefaultUnreachableAfter is how long a cluster that answered must fail
// its probes before it is called unreachable: a kubelet's Lease duration,
// so that one lost answer does not freeze its health checks and write
// every one of its Machines twice.
const DefaultUnreachableAfter = 40 * time.Second

// Backoff after a failed connection: the first retry after
// retryBase, doubling to retryCap.
const (
	retryBase = 2 * time.Second
	retryCap  = 5 * time.Minute
)

// listedMachines is how many Machine names a Deleting message names.
const listedMachines = 3

// Reconciler reconciles WorkloadClusters.
type Reconciler struct {
	// Client reads WorkloadClusters and Machines from the manager's cache
	// and writes their status.
	Client client.Client
	// APIReader reads kubeconfig Secrets straight from the API server:
	// caching every Secret of the management cluster to read a few would
	// cost more than the reads.
	APIReader client.Reader
	// Registry holds the connections.
	Registry *clusters.Registry
	// Recorder emits Events; nil emits none.
	Recorder events.EventRecorder
	// ProbePeriod: zero means DefaultProbePeriod.
	ProbePeriod time.Duration
	// UnreachableAfter: zero means DefaultUnreachableAfter.
	UnreachableAfter time.Duration
	// JoinableProbePeriod is how often a connected cluster's join checks
	// run again (joinable.go); zero means joinprobe.DefaultPeriod.
	JoinableProbePeriod time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu sync.Mutex
	// probed is when each cluster was last probed; failures counts the
	// connection failures in a row, for the backoff; failing is when a
	// cluster that answered first failed a probe. All three are lost with
	// the process, which only starts a grace period afresh.
	probed   map[types.NamespacedName]time.Time
	failures map[types.NamespacedName]int
	failing  map[types.NamespacedName]time.Time

	joins joinprobe.Probes
}

// SetupWithManager registers the controller and the registry (which runs
// the connections) with mgr.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if err := index.Register(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := mgr.Add(r.Registry); err != nil {
		return err
	}
	r.joins.Object = func(key types.NamespacedName) client.Object {
		return &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	}
	if err := mgr.Add(&r.joins); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.WorkloadCluster{}, builder.WithPredicates(predicate.Or[client.Object](deletedOrNew(), pause.Toggled()))).
		// A Machine's arrival may be the first need of a connection, and
		// its going what a deleted cluster waits for; of its updates,
		// only a failed join is this controller's business.
		Watches(&machinistv1.Machine{}, r.machineEvents()).
		// A join check that finished (joinable.go).
		WatchesRawSource(r.joins.Source()).
		WithOptions(opts).
		Named("workloadcluster").
		Complete(r)
}

// deletedOrNew passes the update that marks a WorkloadCluster deleted,
// which changes no generation.
func deletedOrNew() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero() ||
			e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
	}}
}

func clusterOf(_ context.Context, o client.Object) []reconcile.Request {
	m := o.(*machinistv1.Machine)
	if m.Spec.ClusterName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}}}
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	wc := &machinistv1.WorkloadCluster{}
	if err := r.Client.Get(ctx, key, wc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		r.Registry.Disconnect(key)
		r.forget(key)
		// Machines that name a cluster that is not there say so, rather
		// than wait for a connection that nothing will make.
		wc.Namespace, wc.Name = key.Namespace, key.Name
		if machines, err := r.machines(ctx, wc); err != nil || len(machines) > 0 {
			r.Registry.Fail(key, machinistv1.ReasonNotFound,
				fmt.Errorf("no WorkloadCluster %s in namespace %s", key.Name, key.Namespace))
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, nil
	}
	if p := pause.Of(wc, "WorkloadCluster"); p.Paused() {
		// Not probed, not checked, and a deletion waits: its Machines
		// are paused too (pause.Machine), and wait with it.
		before := wc.Status.DeepCopy()
		pause.Mark(&wc.Status.Conditions, p)
		return reconcile.Result{}, r.writeStatus(ctx, wc, before)
	}
	machines, err := r.machines(ctx, wc)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !wc.DeletionTimestamp.IsZero() {
		return r.deleting(ctx, wc, machines)
	}
	if !controllerutil.ContainsFinalizer(wc, machinistv1.WorkloadClusterFinalizer) {
		controllerutil.AddFinalizer(wc, machinistv1.WorkloadClusterFinalizer)
		if err := r.Client.Update(ctx, wc); err != nil {
			return reconcile.Result{}, err
		}
	}
	before := wc.Status.DeepCopy()
	pause.Mark(&wc.Status.Conditions, pause.Pause{})
	result := r.connect(ctx, wc, len(machines))
	result = r.joinable(ctx, wc, result)
	wc.Status.ObservedGeneration = wc.Generation
	return result, r.writeStatus(ctx, wc, before)
}

// connect brings the cluster's connection and status up to date: it
// connects once a Machine needs the cluster, probes a connected one each
// probe period, and backs off after a failure.
func (r *Reconciler) connect(ctx context.Context, wc *machinistv1.WorkloadCluster, machines int) reconcile.Result {
	needed := machines > 0
	key := client.ObjectKeyFromObject(wc)
	// Before anything that can return: a changed joinEndpoint (a new
	// generation wakes this) applies at once, connected or not.
	r.Registry.SetJoinEndpoint(key, wc.Spec.JoinEndpoint)
	now := r.now()
	if r.Registry.Has(key) && !r.due(key, now) && !r.isFailing(key) {
		// Woken by a Machine's arrival or going: nothing to do before
		// the next probe, not even reading the Secret (a scale-up of
		// thousands wakes this once per Machine). A cluster failing its
		// probes is probed again on its backoff instead.
		return reconcile.Result{RequeueAfter: r.untilProbe(key, now)}
	}
	kubeconfig, readErr := r.kubeconfig(ctx, wc)
	connected := readErr == nil && r.Registry.Connected(key, kubeconfig)
	if !needed && !connected {
		setReachable(wc, metav1.ConditionUnknown, machinistv1.ReasonNoMachines,
			"no Machine serves this cluster yet; the manager connects when one does")
		return reconcile.Result{}
	}
	r.mu.Lock()
	if r.probed == nil {
		r.probed = map[types.NamespacedName]time.Time{}
	}
	r.probed[key] = now
	r.mu.Unlock()
	fail := func(reason string, err error) reconcile.Result {
		r.Registry.Fail(key, reason, err)
		was := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		since := now
		if was != nil && was.Status == metav1.ConditionTrue {
			// A cluster that answered until now is called unreachable
			// only once it has failed for UnreachableAfter, and since
			// its first failure.
			since = r.failingSince(key, now)
			if wait := since.Add(r.unreachableAfter()).Sub(now); wait > 0 {
				return reconcile.Result{RequeueAfter: min(r.backoff(key), wait)}
			}
		}
		if was == nil || was.Reason != reason {
			r.event(wc, corev1.EventTypeWarning, reason, "Connect", err.Error())
		}
		meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{
			Type: machinistv1.WorkloadClusterReachable, Status: metav1.ConditionFalse, Reason: reason, Message: err.Error(),
			LastTransitionTime: metav1.NewTime(since), ObservedGeneration: wc.Generation,
		})
		retry := r.backoff(key)
		if r.Registry.Has(key) || wc.Status.Version != "" {
			// Connected before, by this manager or one before it (the
			// version it answered stays in the status): its return is
			// looked for at least every probe period, so that its
			// Machines are not held for the backoff's minutes after it
			// answers again. A manager restarted during a ten-minute
			// outage would otherwise find it back five minutes late.
			retry = min(retry, r.probePeriod())
		}
		return reconcile.Result{RequeueAfter: retry}
	}
	if readErr != nil {
		return fail(machinistv1.ReasonKubeconfigSecretMissing, readErr)
	}
	if err := r.Registry.Connect(ctx, key, kubeconfig); err != nil {
		nc, _ := nodes.NotConnected(err)
		return fail(nc.Reason, nc.Err)
	}
	p, err := r.Registry.Probe(ctx, key)
	if err != nil {
		if nc, ok := nodes.NotConnected(err); ok && nc.Err != nil {
			return fail(nc.Reason, nc.Err)
		}
		return fail(machinistv1.ReasonUnreachable, err)
	}
	r.mu.Lock()
	delete(r.failures, key)
	delete(r.failing, key)
	r.mu.Unlock()
	if was := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable); was == nil || was.Status != metav1.ConditionTrue {
		r.event(wc, corev1.EventTypeNormal, machinistv1.ReasonClusterConnected, "Connect", "connected to "+p.Server+", "+p.Version)
	}
	setReachable(wc, metav1.ConditionTrue, machinistv1.ReasonClusterConnected, "the manager reads the cluster's API")
	wc.Status.Server, wc.Status.Version, wc.Status.Nodes = p.Server, p.Version, ptr.To(int32(p.Nodes))
	wc.Status.Machines = ptr.To(int32(machines))
	return reconcile.Result{RequeueAfter: r.probePeriod()}
}

// deleting holds a deleted WorkloadCluster until no Machine serves it:
// their drains, Node deletions and tokens all need its API.
func (r *Reconciler) deleting(ctx context.Context, wc *machinistv1.WorkloadCluster, machines []string) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(wc)
	if !controllerutil.ContainsFinalizer(wc, machinistv1.WorkloadClusterFinalizer) {
		return reconcile.Result{}, nil
	}
	if len(machines) == 0 {
		r.Registry.Disconnect(key)
		r.forget(key)
		controllerutil.RemoveFinalizer(wc, machinistv1.WorkloadClusterFinalizer)
		return reconcile.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, wc))
	}
	before := wc.Status.DeepCopy()
	now := r.now()
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterDeleting)
	// Each Machine that goes wakes this reconcile; its count is brought
	// up to date once a probe period, not at each.
	if c == nil || c.Status != metav1.ConditionTrue || r.due(key, now) {
		if c == nil || c.Status != metav1.ConditionTrue {
			r.event(wc, corev1.EventTypeNormal, machinistv1.ReasonWaitingForMachines, "Delete",
				fmt.Sprintf("deletion waits for the %d Machines that serve this cluster", len(machines)))
		}
		r.mu.Lock()
		if r.probed == nil {
			r.probed = map[types.NamespacedName]time.Time{}
		}
		r.probed[key] = now
		r.mu.Unlock()
		meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{
			Type: machinistv1.WorkloadClusterDeleting, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonWaitingForMachines,
			Message:            waitingFor(machines),
			ObservedGeneration: wc.Generation,
		})
		wc.Status.Machines = ptr.To(int32(len(machines)))
	}
	return reconcile.Result{RequeueAfter: r.probePeriod()}, r.writeStatus(ctx, wc, before)
}

func waitingFor(machines []string) string {
	sort.Strings(machines)
	names := strings.Join(machines[:min(len(machines), listedMachines)], ", ")
	if len(machines) > listedMachines {
		names += ", …"
	}
	return fmt.Sprintf("waiting for the %d Machines that serve this cluster to be deleted (%s): delete them, or their MachineSets and MachineDeployments", len(machines), names)
}

// kubeconfig reads the cluster's kubeconfig from its Secret.
func (r *Reconciler) kubeconfig(ctx context.Context, wc *machinistv1.WorkloadCluster) ([]byte, error) {
	ref := wc.Spec.Kubeconfig
	var s corev1.Secret
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: wc.Namespace, Name: ref.SecretName}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s/%s does not exist", wc.Namespace, ref.SecretName)
		}
		return nil, fmt.Errorf("reading secret %s/%s: %w", wc.Namespace, ref.SecretName, err)
	}
	data, ok := s.Data[ref.DataKey()]
	if !ok || len(data) == 0 {
		return nil, fmt.Errorf("secret %s/%s has no key %q", wc.Namespace, ref.SecretName, ref.DataKey())
	}
	return data, nil
}

// machines names the Machines that serve wc, from the cache.
func (r *Reconciler) machines(ctx context.Context, wc *machinistv1.WorkloadCluster) ([]string, error) {
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(wc.Namespace),
		client.MatchingFields{index.MachineByCluster: wc.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	names := make([]string, len(list.Items))
	for i := range list.Items {
		names[i] = list.Items[i].Name
	}
	return names, nil
}

func (r *Reconciler) writeStatus(ctx context.Context, wc *machinistv1.WorkloadCluster, before *machinistv1.WorkloadClusterStatus) error {
	if equality.Semantic.DeepEqual(before, &wc.Status) {
		return nil
	}
	err := r.Client.Status().Update(ctx, wc)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// A newer WorkloadCluster is on its way to the cache, and wakes
		// this controller again.
		return nil
	}
	return err
}

func setReachable(wc *machinistv1.WorkloadCluster, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{
		Type: machinistv1.WorkloadClusterReachable, Status: status, Reason: reason, Message: message,
		ObservedGeneration: wc.Generation,
	})
}

func (r *Reconciler) due(key types.NamespacedName, now time.Time) bool {
	return r.untilProbe(key, now) <= 0
}

func (r *Reconciler) untilProbe(key types.NamespacedName, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.probed[key]
	if !ok {
		return 0
	}
	return at.Add(r.probePeriod()).Sub(now)
}

// backoff counts a failure and returns how long to wait before the next
// attempt.
func (r *Reconciler) backoff(key types.NamespacedName) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == nil {
		r.failures = map[types.NamespacedName]int{}
	}
	n := r.failures[key]
	r.failures[key] = n + 1
	d := retryBase
	for i := 0; i < n && d < retryCap; i++ {
		d *= 2
	}
	return min(d, retryCap)
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.joins.Forget(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.probed, key)
	delete(r.failures, key)
	delete(r.failing, key)
}

// isFailing reports whether the cluster's last probe or connection failed.
func (r *Reconciler) isFailing(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures[key] > 0
}

// failingSince is when the cluster's current run of failed probes began,
// now for the first.
func (r *Reconciler) failingSince(key types.NamespacedName, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing == nil {
		r.failing = map[types.NamespacedName]time.Time{}
	}
	if at, ok := r.failing[key]; ok {
		return at
	}
	r.failing[key] = now
	return now
}

func (r *Reconciler) unreachableAfter() time.Duration {
	if r.UnreachableAfter > 0 {
		return r.UnreachableAfter
	}
	return DefaultUnreachableAfter
}

func (r *Reconciler) event(wc *machinistv1.WorkloadCluster, kind, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(wc, nil, kind, reason, action, "%s", note)
	}
}

func (r *Reconciler) probePeriod() time.Duration {
	if r.ProbePeriod > 0 {
		return r.ProbePeriod
	}
	return DefaultProbePeriod
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
