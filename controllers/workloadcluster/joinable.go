package workloadcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinable"
)

// DefaultJoinableProbePeriod is how often a connected cluster's join
// checks run again: they make a token, a certificate request and a
// node certificate in the cluster, and a cluster's flags seldom change.
const DefaultJoinableProbePeriod = 10 * time.Minute

// joinRecheckAfter is how long after a cluster's last check a Machine's
// failed join may ask for another: a fleet of failing Machines costs the
// cluster one check a minute, not one each.
const joinRecheckAfter = time.Minute

// Reasons of the Joinable condition besides those of the checks
// (joinable.Reason*), which it gives as they are when False.
const (
	// ReasonJoinable: every check passed.
	ReasonJoinable = "Joinable"
	// ReasonJoinCheckForbidden: the manager's credentials for the
	// cluster may not do what the checks do; the message names it.
	ReasonJoinCheckForbidden = "CheckForbidden"
	// ReasonJoinCheckFailed: the checks could not be made (the cluster
	// stopped answering, say); a condition said before is kept.
	ReasonJoinCheckFailed = "CheckFailed"
)

// joinRights are what joinable.Check does in a cluster with the
// manager's credentials (the rest it does with a token it made, or as
// the node that token got a certificate for).
var joinRights = []authorizationv1.ResourceAttributes{
	{Verb: "create", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "get", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "delete", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
	{Verb: "get", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
	{Verb: "delete", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
}

// joinChecks runs each connected cluster's join checks, one at a time
// per cluster, away from Reconcile (a check takes from half a second to
// joinable.DefaultWait), and keeps each cluster's latest outcome for
// Reconcile to write. It is a manager.Runnable: checks run under the
// manager's context. What it keeps is lost with the process; the
// condition written stays, and the checks run again once connected.
type joinChecks struct {
	mu       sync.Mutex
	ctx      context.Context
	clusters map[types.NamespacedName]*joinState
	// done wakes a cluster's reconcile once its check has finished.
	done chan event.GenericEvent
	runs uint64
}

// joinState is one cluster's checks.
type joinState struct {
	// config is the connection the last check was made through: a new
	// connection is checked at once.
	config  *rest.Config
	started time.Time
	// run identifies the running check, cancel ends it; zero and nil
	// when none runs.
	run    uint64
	cancel context.CancelFunc
	// outcome is the latest check's, nil before the first has finished.
	outcome *joinOutcome
	// recheck: a Machine's failed join asks for a check.
	recheck bool
}

// joinOutcome is what a check found, as the Joinable condition says it.
type joinOutcome struct {
	status          metav1.ConditionStatus
	reason, message string
	// keep: the check could not be made, and a condition said before
	// stays as it is.
	keep bool
}

// Start implements manager.Runnable.
func (j *joinChecks) Start(ctx context.Context) error {
	j.mu.Lock()
	j.ctx = ctx
	j.mu.Unlock()
	<-ctx.Done()
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, s := range j.clusters {
		if s.cancel != nil {
			s.cancel()
		}
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader connects, and checks.
func (j *joinChecks) NeedLeaderElection() bool { return true }

// source wakes a cluster's reconcile once its check has finished.
func (j *joinChecks) source() source.Source {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done == nil {
		j.done = make(chan event.GenericEvent, 64)
	}
	return source.Channel(j.done, &handler.EnqueueRequestForObject{})
}

// joinable brings wc's Joinable condition up to the latest check's
// outcome, and starts a check when one is due: on the cluster's first
// connection (and each new one), each JoinableProbePeriod, and after a
// Machine's failed join, at most once a minute. A cluster not connected,
// or failing its probes, keeps the condition it has.
func (r *Reconciler) joinable(ctx context.Context, wc *machinistv1.WorkloadCluster, result reconcile.Result) reconcile.Result {
	key := client.ObjectKeyFromObject(wc)
	cfg := r.Registry.Config(key)
	reachable := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
	if cfg == nil || r.isFailing(key) || reachable == nil || reachable.Status != metav1.ConditionTrue {
		return result
	}
	outcome, wait := r.joins.next(ctx, key, cfg, r.now(), r.joinablePeriod())
	if outcome != nil {
		setJoinable(wc, outcome)
	}
	if wait > 0 && (result.RequeueAfter <= 0 || wait < result.RequeueAfter) {
		result.RequeueAfter = wait
	}
	return result
}

// setJoinable writes outcome into wc's Joinable condition, changing it
// only when its status, reason or message differ.
func setJoinable(wc *machinistv1.WorkloadCluster, o *joinOutcome) {
	was := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	if o.keep && was != nil {
		return
	}
	if was != nil && was.Status == o.status && was.Reason == o.reason && was.Message == o.message {
		return
	}
	meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{
		Type: machinistv1.WorkloadClusterJoinable, Status: o.status, Reason: o.reason, Message: o.message,
		ObservedGeneration: wc.Generation,
	})
}

// next returns the cluster's latest outcome, and starts a check through
// cfg when one is due; wait is how long until the next is due, zero
// while one runs (its end wakes the reconcile).
func (j *joinChecks) next(ctx context.Context, key types.NamespacedName, cfg *rest.Config, now time.Time, period time.Duration) (*joinOutcome, time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.clusters == nil {
		j.clusters = map[types.NamespacedName]*joinState{}
	}
	s := j.clusters[key]
	if s == nil {
		s = &joinState{}
		j.clusters[key] = s
	}
	if s.cancel != nil {
		return s.outcome, 0
	}
	wait := s.started.Add(period).Sub(now)
	if s.recheck {
		wait = min(wait, s.started.Add(joinRecheckAfter).Sub(now))
	}
	if s.config == cfg && wait > 0 {
		return s.outcome, wait
	}
	if j.ctx == nil {
		// The manager has not started this runnable yet.
		return s.outcome, time.Second
	}
	j.runs++
	run := j.runs
	cctx, cancel := context.WithTimeout(j.ctx, joinable.DefaultWait+time.Minute)
	s.config, s.started, s.run, s.cancel, s.recheck = cfg, now, run, cancel, false
	log := ctrllog.FromContext(ctx)
	go func() {
		o := checkJoinable(cctx, cfg)
		if o.status == metav1.ConditionUnknown {
			log.Info("could not check whether machines can join the cluster", "reason", o.reason, "message", o.message)
		}
		j.finish(key, run, o)
	}()
	return s.outcome, 0
}

// finish keeps run's outcome, unless the cluster was forgotten meanwhile,
// and wakes the cluster's reconcile.
func (j *joinChecks) finish(key types.NamespacedName, run uint64, o *joinOutcome) {
	j.mu.Lock()
	s := j.clusters[key]
	if s == nil || s.run != run {
		j.mu.Unlock()
		return
	}
	s.cancel()
	s.run, s.cancel = 0, nil
	if !o.keep || s.outcome == nil {
		s.outcome = o
	}
	ctx, done := j.ctx, j.done
	j.mu.Unlock()
	if done == nil {
		return
	}
	wc := &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case done <- event.GenericEvent{Object: wc}:
	case <-ctx.Done():
	}
}

// recheck asks for the cluster to be checked again, no sooner than a
// minute after its last check.
func (j *joinChecks) recheck(key types.NamespacedName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.clusters[key]; s != nil {
		s.recheck = true
	}
}

// forget stops the cluster's check and forgets its outcome.
func (j *joinChecks) forget(key types.NamespacedName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.clusters[key]; s != nil && s.cancel != nil {
		s.cancel()
	}
	delete(j.clusters, key)
}

// checkJoinable runs the join checks through cfg and says what they
// found as the Joinable condition says it: a message stable from one
// check to the next that finds the same (no token's or request's name,
// no time), so that a settled cluster is not written.
func checkJoinable(ctx context.Context, cfg *rest.Config) *joinOutcome {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return &joinOutcome{status: metav1.ConditionUnknown, reason: ReasonJoinCheckFailed, message: "the checks could not run: " + err.Error()}
	}
	lacked, err := lackedRights(ctx, kube)
	switch {
	case err != nil:
		return cannotCheck("the manager could not ask what its credentials allow", err)
	case len(lacked) > 0:
		return &joinOutcome{status: metav1.ConditionUnknown, reason: ReasonJoinCheckForbidden,
			message: fmt.Sprintf("the manager's credentials for this cluster may not %s, which the checks of what a join needs do: grant them to the kubeconfig's user, or check by hand with machinist cluster prepare --dry-run",
				strings.Join(lacked, ", "))}
	}
	report, err := joinable.Check(ctx, cfg, joinable.Options{})
	if err != nil {
		return cannotCheck("the checks could not make their bootstrap token in kube-system", err)
	}
	return outcomeOf(report)
}

// outcomeOf says what report found as the Joinable condition says it.
// It carries the findings' Detail and Fix, Machinist's own words, and
// never what the cluster said (Finding.Said): a tenant's cluster's text
// of any length does not reach the status.
func outcomeOf(report joinable.Report) *joinOutcome {
	var failures, unchecked []joinable.Finding
	var uncleaned *joinable.Finding
	for _, f := range report.Failures() {
		switch {
		case f.Reason == joinable.ReasonCheckFailed:
			unchecked = append(unchecked, f)
		case !f.Blocks():
			// Machines join: not a reason to call the cluster
			// unjoinable, nor to make its Machines wait with it.
			uncleaned = &f
		default:
			failures = append(failures, f)
		}
	}
	switch {
	case len(failures) > 0:
		f := failures[0]
		msg := f.Detail + ": " + f.Fix
		if n := len(failures) - 1; n > 0 {
			msg += fmt.Sprintf(" (and %d more: run machinist cluster prepare --dry-run for the list)", n)
		}
		return &joinOutcome{status: metav1.ConditionFalse, reason: f.Reason, message: msg}
	case len(unchecked) > 0:
		// Its detail is an error that may name the check's token or
		// node: only which check could not be made is said.
		return &joinOutcome{status: metav1.ConditionUnknown, reason: ReasonJoinCheckFailed, keep: true,
			message: fmt.Sprintf("the check of the %s could not be made; it is made again at the next probe", unchecked[0].Check)}
	}
	if uncleaned != nil {
		return &joinOutcome{status: metav1.ConditionTrue, reason: ReasonJoinable,
			message: "machines can join, but expired bootstrap tokens are not deleted: " + uncleaned.Fix}
	}
	return &joinOutcome{status: metav1.ConditionTrue, reason: ReasonJoinable,
		message: fmt.Sprintf("machines can join: none of the %d checks of what a join needs failed", len(report))}
}

// cannotCheck is the outcome of checks that could not be made because of
// err: Unknown, saying which right is missing if that is why, and
// keeping what was said before otherwise.
func cannotCheck(what string, err error) *joinOutcome {
	if apierrors.IsForbidden(err) {
		return &joinOutcome{status: metav1.ConditionUnknown, reason: ReasonJoinCheckForbidden,
			message: what + ": the manager's credentials for this cluster are forbidden it (" + string(apierrors.ReasonForError(err)) + ")"}
	}
	why := "the cluster did not answer"
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		why = "the cluster answered " + string(r)
	}
	return &joinOutcome{status: metav1.ConditionUnknown, reason: ReasonJoinCheckFailed, keep: true,
		message: what + " (" + why + "); they are made again at the next probe"}
}

// lackedRights names each of joinRights the manager's credentials lack
// in kube's cluster.
func lackedRights(ctx context.Context, kube kubernetes.Interface) ([]string, error) {
	var lacked []string
	for _, attrs := range joinRights {
		review, err := kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		if !review.Status.Allowed {
			what := attrs.Verb + " " + attrs.Resource
			if attrs.Group != "" {
				what += "." + attrs.Group
			}
			if attrs.Namespace != "" {
				what += " in " + attrs.Namespace
			}
			lacked = append(lacked, what)
		}
	}
	return lacked, nil
}

// machineEvents wakes a Machine's cluster when the Machine arrives or
// goes (the first may need a connection, the last may be what a deleted
// cluster waits for), and when its Ready condition starts to report a
// failed join: the cluster is then checked again, at most once a minute.
// A Machine's other updates are none of this controller's business.
func (r *Reconciler) machineEvents() handler.Funcs {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range clusterOf(context.Background(), o) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			reason, failed := joinFailed(e.ObjectOld, e.ObjectNew)
			if !failed {
				return
			}
			for _, req := range clusterOf(ctx, e.ObjectNew) {
				if r.joinableSays(ctx, req.NamespacedName, reason) {
					// The Machine repeats its cluster's own condition:
					// nothing new to check.
					continue
				}
				r.joins.recheck(req.NamespacedName)
				q.Add(req)
			}
		},
	}
}

// joinableSays reports whether the cluster's Joinable condition, in the
// cache, is False with reason.
func (r *Reconciler) joinableSays(ctx context.Context, key types.NamespacedName, reason string) bool {
	wc := &machinistv1.WorkloadCluster{}
	if err := r.Client.Get(ctx, key, wc); err != nil {
		return false
	}
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

// joinFailed reports whether a Machine's Ready reason became one of a
// failed join's, and which.
func joinFailed(o, n client.Object) (string, bool) {
	om, ok := o.(*machinistv1.Machine)
	nm, ok2 := n.(*machinistv1.Machine)
	if !ok || !ok2 {
		return "", false
	}
	reason := func(m *machinistv1.Machine) string {
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c != nil {
			return c.Reason
		}
		return ""
	}
	was, is := reason(om), reason(nm)
	return is, was != is && slices.Contains(machinistv1.JoinFailureReasons, is)
}

func (r *Reconciler) joinablePeriod() time.Duration {
	if r.JoinableProbePeriod > 0 {
		return r.JoinableProbePeriod
	}
	return DefaultJoinableProbePeriod
}
