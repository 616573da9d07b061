// Package joinprobe checks, apart from any reconcile, whether machines
// can join each cluster a controller keeps (the checks of package
// clusters/joinable, made with the manager's credentials), on a slow
// period and after a Machine's failed join, and says what it found as a
// Joinable condition. WorkloadClusters and the ManagementCluster use it
// alike.
package joinprobe

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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinable"
)

// DefaultPeriod is how often a connected cluster's join
// checks run again: they make a token, a certificate request and a
// node certificate in the cluster, and a cluster's flags seldom change.
const DefaultPeriod = 10 * time.Minute

// recheckAfter is how long after a cluster's last check a Machine's
// failed join may ask for another: a fleet of failing Machines costs the
// cluster one check a minute, not one each.
const recheckAfter = time.Minute

// Reasons of the Joinable condition besides those of the checks
// (joinable.Reason*), which it gives as they are when False.
const (
	// ReasonJoinable: every check passed.
	ReasonJoinable = "Joinable"
	// ReasonCheckForbidden: the manager's credentials for the
	// cluster may not do what the checks do; the message names it.
	ReasonCheckForbidden = "CheckForbidden"
	// ReasonCheckFailed: the checks could not be made (the cluster
	// stopped answering, say); a condition said before is kept.
	ReasonCheckFailed = "CheckFailed"
)

// rights are what joinable.Check does in a cluster with the
// manager's credentials (the rest it does with a token it made, or as
// the node that token got a certificate for).
var rights = []authorizationv1.ResourceAttributes{
	{Verb: "create", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "get", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "delete", Resource: "secrets", Namespace: metav1.NamespaceSystem},
	{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
	{Verb: "get", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
	{Verb: "delete", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
}

// Probes runs each connected cluster's join checks, one at a time
// per cluster, away from Reconcile (a check takes from half a second to
// joinable.DefaultWait), and keeps each cluster's latest outcome for
// Reconcile to write. It is a manager.Runnable: checks run under the
// manager's context. What it keeps is lost with the process; the
// condition written stays, and the checks run again once connected.
type Probes struct {
	// Object is what a finished check wakes: the cluster's object
	// under key, for a reconcile of its kind.
	Object func(key types.NamespacedName) client.Object

	mu       sync.Mutex
	ctx      context.Context
	clusters map[types.NamespacedName]*state
	// done wakes a cluster's reconcile once its check has finished.
	done chan event.GenericEvent
	runs uint64
}

// state is one cluster's checks.
type state struct {
	// config is the connection the last check was made through: a new
	// connection is checked at once.
	config  *rest.Config
	started time.Time
	// run identifies the running check, cancel ends it; zero and nil
	// when none runs.
	run    uint64
	cancel context.CancelFunc
	// outcome is the latest check's, nil before the first has finished.
	outcome *Outcome
	// recheck: a Machine's failed join asks for a check.
	recheck bool
}

// Outcome is what a check found, as the Joinable condition says it.
type Outcome struct {
	Status          metav1.ConditionStatus
	Reason, Message string
	// Keep: the check could not be made, and a condition said before
	// stays as it is.
	Keep bool
}

// Start implements manager.Runnable.
func (j *Probes) Start(ctx context.Context) error {
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
func (j *Probes) NeedLeaderElection() bool { return true }

// Source wakes a cluster's reconcile once its check has finished.
func (j *Probes) Source() source.Source {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done == nil {
		j.done = make(chan event.GenericEvent, 64)
	}
	return source.Channel(j.done, &handler.EnqueueRequestForObject{})
}

// Set writes o into conditions as the condition of type kind (Joinable),
// changing it only when its status, reason or message differ; an outcome
// to Keep leaves a condition said before as it is. It reports whether
// it changed the condition.
func Set(conditions *[]metav1.Condition, kind string, generation int64, o *Outcome) bool {
	was := meta.FindStatusCondition(*conditions, kind)
	if o.Keep && was != nil {
		return false
	}
	if was != nil && was.Status == o.Status && was.Reason == o.Reason && was.Message == o.Message {
		return false
	}
	return meta.SetStatusCondition(conditions, metav1.Condition{
		Type: kind, Status: o.Status, Reason: o.Reason, Message: o.Message, ObservedGeneration: generation,
	})
}

// Next returns the cluster's latest outcome, and starts a check through
// cfg when one is due; wait is how long until the next is due, zero
// while one runs (its end wakes the reconcile).
func (j *Probes) Next(ctx context.Context, key types.NamespacedName, cfg *rest.Config, now time.Time, period time.Duration) (*Outcome, time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.clusters == nil {
		j.clusters = map[types.NamespacedName]*state{}
	}
	s := j.clusters[key]
	if s == nil {
		s = &state{}
		j.clusters[key] = s
	}
	if s.cancel != nil {
		return s.outcome, 0
	}
	wait := s.started.Add(period).Sub(now)
	if s.recheck {
		wait = min(wait, s.started.Add(recheckAfter).Sub(now))
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
		o := Check(cctx, cfg)
		if o.Status == metav1.ConditionUnknown {
			log.Info("could not check whether machines can join the cluster", "reason", o.Reason, "message", o.Message)
		}
		j.finish(key, run, o)
	}()
	return s.outcome, 0
}

// finish keeps run's outcome, unless the cluster was forgotten meanwhile,
// and wakes the cluster's reconcile.
func (j *Probes) finish(key types.NamespacedName, run uint64, o *Outcome) {
	j.mu.Lock()
	s := j.clusters[key]
	if s == nil || s.run != run {
		j.mu.Unlock()
		return
	}
	s.cancel()
	s.run, s.cancel = 0, nil
	if !o.Keep || s.outcome == nil {
		s.outcome = o
	}
	ctx, done := j.ctx, j.done
	j.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case done <- event.GenericEvent{Object: j.Object(key)}:
	case <-ctx.Done():
	}
}

// Recheck asks for the cluster to be checked again, no sooner than a
// minute after its last check.
func (j *Probes) Recheck(key types.NamespacedName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.clusters[key]; s != nil {
		s.recheck = true
	}
}

// Forget stops the cluster's check and forgets its outcome.
func (j *Probes) Forget(key types.NamespacedName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.clusters[key]; s != nil && s.cancel != nil {
		s.cancel()
	}
	delete(j.clusters, key)
}

// Check runs the join checks through cfg and says what they
// found as the Joinable condition says it: a message stable from one
// check to the next that finds the same (no token's or request's name,
// no time), so that a settled cluster is not written.
func Check(ctx context.Context, cfg *rest.Config) *Outcome {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckFailed, Message: "the checks could not run: " + err.Error()}
	}
	lacked, err := lackedRights(ctx, kube)
	switch {
	case err != nil:
		return cannotCheck("the manager could not ask what its credentials allow", err)
	case len(lacked) > 0:
		return &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckForbidden,
			Message: fmt.Sprintf("the manager's credentials for this cluster may not %s, which the checks of what a join needs do: grant them to the kubeconfig's user, or check by hand with machinist cluster prepare --dry-run",
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
func outcomeOf(report joinable.Report) *Outcome {
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
		return &Outcome{Status: metav1.ConditionFalse, Reason: f.Reason, Message: msg}
	case len(unchecked) > 0:
		// Its detail is an error that may name the check's token or
		// node: only which check could not be made is said.
		return &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckFailed, Keep: true,
			Message: fmt.Sprintf("the check of the %s could not be made; it is made again at the next probe", unchecked[0].Check)}
	}
	if uncleaned != nil {
		return &Outcome{Status: metav1.ConditionTrue, Reason: ReasonJoinable,
			Message: "machines can join, but expired bootstrap tokens are not deleted: " + uncleaned.Fix}
	}
	return &Outcome{Status: metav1.ConditionTrue, Reason: ReasonJoinable,
		Message: fmt.Sprintf("machines can join: none of the %d checks of what a join needs failed", len(report))}
}

// cannotCheck is the outcome of checks that could not be made because of
// err: Unknown, saying which right is missing if that is why, and
// keeping what was said before otherwise.
func cannotCheck(what string, err error) *Outcome {
	if apierrors.IsForbidden(err) {
		return &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckForbidden,
			Message: what + ": the manager's credentials for this cluster are forbidden it (" + string(apierrors.ReasonForError(err)) + ")"}
	}
	why := "the cluster did not answer"
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		why = "the cluster answered " + string(r)
	}
	return &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckFailed, Keep: true,
		Message: what + " (" + why + "); they are made again at the next probe"}
}

// lackedRights names each of rights the manager's credentials lack
// in kube's cluster.
func lackedRights(ctx context.Context, kube kubernetes.Interface) ([]string, error) {
	var lacked []string
	for _, attrs := range rights {
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

// FailedJoin reports whether a Machine's Ready reason became one of a
// failed join's, and which.
func FailedJoin(o, n client.Object) (string, bool) {
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
