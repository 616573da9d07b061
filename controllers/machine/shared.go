package machine

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/internal/patch"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// What more than one phase does lives here, so that each handler's file
// holds what its own phase does, and following a handler leads to this
// file and no other of the controller's: what a step records (Events,
// when to look again, a retry, a failure, an operation's start and end),
// the provider for a Machine and its call, the join data a machine boots
// with (and the token kept while its cluster is down), what the Machine
// records of its Node and writes to it, and a drain's abort. The driver
// that calls the handlers is step.go.

// The step: what a handler records for the reconcile's one write.

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

// wait ends the reconcile without a move; after, if positive, is when to
// look again.
func (s *step) wait(reason string, after time.Duration) outcome {
	s.after(after)
	return outcome{reason: reason}
}

// enteredAt is when the Machine entered its current phase.
func (s *step) enteredAt() time.Time {
	if t := s.m.Status.LastTransition; t != nil {
		return t.Time.Time
	}
	return s.m.CreationTimestamp.Time
}

// since is the later of t and the time the Machine's cluster was last
// found reachable again: when a wait on its Node starts counting.
func (s *step) since(t time.Time) time.Time {
	if s.back.After(t) {
		return s.back
	}
	return t
}

// retry records a transient error and waits for the next attempt. The
// Machine says why it waits in its Ready condition; a Warning Event marks
// only a change of reason, not every attempt.
func (r *Reconciler) retry(s *step, reason string, err error) outcome {
	if providers.IsUnavailable(err) {
		reason = machinistv1.ReasonProviderUnavailable
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
	return s.wait(reason, delay)
}

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

// failMachine moves the Machine to Failed with a reason for people.
func (s *step) failMachine(reason, message string) outcome {
	meta.SetStatusCondition(&s.m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: message, ObservedGeneration: s.m.Generation,
	})
	return settle(phases.Fail)
}

// startOperation marks the Machine's pending operation as started.
func startOperation(s *step) {
	op := s.m.Status.Operation
	at := metav1.NewTime(s.now)
	op.State, op.StartedAt = machinistv1.OperationRunning, &at
	op.Message, op.Reason = "started", ""
	s.note(corev1.EventTypeNormal, reasonStarted, operation.Verb(op.Type), "%s %s started", operation.Verb(op.Type), op.ID)
}

// endOperation records how the operation in flight ended.
func endOperation(s *step, state machinistv1.OperationState, message string) {
	op := s.m.Status.Operation
	at := metav1.NewTime(s.now)
	op.State, op.CompletedAt, op.Message, op.Reason = state, &at, message, ""
	kind, reason := corev1.EventTypeNormal, reasonSucceeded
	if state == machinistv1.OperationFailed {
		kind, reason = corev1.EventTypeWarning, reasonFailed
	}
	s.note(kind, reason, operation.Verb(op.Type), "%s %s: %s", operation.Verb(op.Type), op.ID, message)
}

// downPoll is how often a Machine waiting for its cluster looks again,
// should the WorkloadCluster's change that wakes it be missed. A look that
// finds nothing new writes nothing.
const downPoll = time.Minute

// unseen has a Machine whose cluster cannot be reached wait for it, saying
// so in its condition t (False, or Unknown for what cannot be known) with
// reason ClusterUnreachable. The message names the cluster and since when,
// never the error, which changes from probe to probe: the Machine is
// written once when its cluster goes and once when it returns, not per
// probe or per retry.
func (s *step) unseen(t string, status metav1.ConditionStatus, what string) outcome {
	meta.SetStatusCondition(&s.m.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: machinistv1.ReasonClusterUnreachable,
		Message:            fmt.Sprintf("%s: %s", s.down.Unseen(), what),
		ObservedGeneration: s.m.Generation,
	})
	return s.wait("its cluster cannot be reached", downPoll)
}

// The provider: which one acts for a Machine, and its call for an
// operation.

// unavailable is why no provider can act for a Machine now: a reason for
// its Ready condition and a message for people.
type unavailable struct {
	reason string
	err    error
}

// actuatorFor picks the provider for a Machine: by its class while it has
// no instance, then by its providerID's scheme, so a Machine can still be
// deleted after its class is gone.
func (r *Reconciler) actuatorFor(m *machinistv1.Machine, class *machinistv1.MachineClass) (providers.Actuator, *unavailable) {
	if id := m.Status.ProviderID; id != "" {
		u, err := url.Parse(id)
		if err != nil || u.Scheme == "" {
			return nil, &unavailable{machinistv1.ReasonInvalidProviderID, fmt.Errorf("providerID %q does not start with <provider>://", id)}
		}
		act, err := r.Actuators.Get(u.Scheme)
		if err != nil {
			return nil, &unavailable{machinistv1.ReasonProviderNotFound, fmt.Errorf("providerID %q: %w", id, err)}
		}
		return act, nil
	}
	if class == nil {
		return nil, &unavailable{machinistv1.ReasonMachineClassNotFound, fmt.Errorf(
			"MachineClass %q does not exist in namespace %q; create it, or fix spec.classRef.name",
			m.Spec.ClassRef.Name, m.Namespace)}
	}
	act, err := r.Actuators.Get(class.Spec.Provider)
	if err != nil {
		return nil, &unavailable{machinistv1.ReasonProviderNotFound, fmt.Errorf("MachineClass %q names provider %q: %w",
			class.Name, class.Spec.Provider, err)}
	}
	return act, nil
}

// callProvider asks the provider to reboot, repair or update the drained
// (or, for a reboot without drain, running) Machine and moves it on. The
// provider is idempotent on the operation ID, so a controller that stopped
// before storing the move calls it again harmlessly.
func (r *Reconciler) callProvider(ctx context.Context, s *step) outcome {
	m := s.m
	op := m.Status.Operation
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		return r.retry(s, why.reason, why.err)
	}
	req := providers.Operation{ID: op.ID, Hard: op.Options != nil && op.Options.Mode == machinistv1.RebootHard}
	// Judged before the reboot: a machine that boots fast could renew
	// its Lease before the provider even answers.
	var dead *deadNode
	if !operation.Drains(op.Type, op.Options) && req.Hard && s.down == nil {
		var err error
		if dead, err = r.unreachable(ctx, s); err != nil {
			return fail(err)
		}
	}
	var err error
	event, doing := phases.Reboot, "rebooting"
	switch op.Type {
	case machinistv1.OperationRepair:
		event, doing = phases.Repair, "repairing"
		if s.down != nil {
			// The re-imaged machine re-joins once the cluster is back,
			// with a token kept for it until then.
			setUnseenHealth(s)
			if req.Join, err = r.deferJoin(ctx, s); err != nil {
				return s.unseen(machinistv1.ConditionReady, metav1.ConditionFalse,
					fmt.Sprintf("the repair waits for the cluster: %v", err))
			}
		} else if req.Join, err = r.join(ctx, s); err != nil {
			return r.joinFailed(s, machinistv1.ReasonProviderError, err)
		}
		err = act.Repair(ctx, m.Status.ProviderID, req)
	case machinistv1.OperationUpdate:
		event, doing = phases.Update, "updating"
		req.Version = op.ToVersion
		err = act.Update(ctx, m.Status.ProviderID, req)
	default:
		err = act.Reboot(ctx, m.Status.ProviderID, req)
	}
	if providers.IsPermanent(err) {
		msg := fmt.Sprintf("the provider refused: %v", err)
		if s.fsm.State() == machinistv1.MachineDraining {
			return r.abort(ctx, s, msg)
		}
		endOperation(s, machinistv1.OperationFailed, msg)
		return s.wait("the provider refused", 0)
	}
	if err != nil {
		return r.retry(s, machinistv1.ReasonProviderError, err)
	}
	if dead != nil {
		if err := r.forgetDeadBoot(ctx, s, dead); err != nil {
			return fail(err)
		}
	}
	op.Message = fmt.Sprintf("the provider is %s the instance; waiting for its Node to report a new boot ID and Ready", doing)
	if op.Type == machinistv1.OperationUpdate {
		op.Message = fmt.Sprintf("the provider is updating the instance to %s; waiting for its Node to report it, a new boot ID and Ready", op.ToVersion)
	}
	s.after(r.operationTimeout())
	if d := operation.Deadline(op); !d.IsZero() {
		s.after(d.Sub(s.now))
	}
	// The Node may have booted anew already: a fast machine, or an
	// earlier call that took effect though its reply was lost or its move
	// not stored. Its Node's event was then spent while the Machine was
	// not yet Rebooting, and this reconcile's own write wakes nothing:
	// the new phase's handler looks now, not at the deadline.
	return advance(event)
}

// The join: what a machine boots with to become its cluster's Node.

// join makes what m's instance joins its cluster with: a bootstrap token
// of its own in that cluster, which lives long enough for the slowest
// boot the controller waits for, and goes once the machine has joined.
func (r *Reconciler) join(ctx context.Context, s *step) (bootstrap.Join, error) {
	j, err := s.nodes.Join(ctx, s.m, max(r.provisionTimeout(), r.operationTimeout())+joinSlack)
	if err != nil {
		return bootstrap.Join{}, fmt.Errorf("making the join data for machine %s/%s: %w", s.m.Namespace, s.m.Name, err)
	}
	return j, nil
}

// joinFailed retries a Machine whose join data could not be made: under
// ClusterUnreachable when its cluster did not answer (the cluster's fault,
// which the Machine waits out), under reason otherwise.
func (r *Reconciler) joinFailed(s *step, reason string, err error) outcome {
	if nodes.Unreachable(err) {
		reason = machinistv1.ReasonClusterUnreachable
	}
	return r.retry(s, reason, err)
}

// A repair while the Machine's cluster cannot be reached hands the
// re-imaged machine a bootstrap token its cluster does not hold yet. Until
// the cluster answers, the token is kept in a Secret in the manager's own
// namespace of the management cluster, so that a manager that restarts
// meanwhile hands the same token to a retried call and publishes it when
// the cluster is back. The machine's agent, like a kubelet, keeps asking
// for its certificate until the token is accepted.
//
// A token published in a cluster becomes a node's credentials there, so
// the kept one is trusted only because the manager made it, never because
// of its name. It lives where no tenant may write (the Machine's own
// namespace is the tenant's, and a Secret made there under the same name
// would be a token of their choosing), and the Machine's status records
// the UID kube-apiserver gave the Secret the manager made
// (status.keptToken; status is the controllers' to write), which no other
// Secret of that name has. The record is stored before the provider is
// given the token, so a Secret the status does not record was given to no
// machine, and is deleted to make way for the manager's own.

// keptTokenKey is the key of the token in that Secret.
const keptTokenKey = "token"

// Event reasons of kept tokens.
const (
	// reasonJoinPublished: a token handed out while the cluster was
	// down is the cluster's now.
	reasonJoinPublished = "JoinPublished"
	// reasonKeptTokenRefused: a Secret under the kept token's name that
	// the manager did not make (or no longer records) is not used.
	reasonKeptTokenRefused = "KeptTokenRefused"
	// reasonKeptTokenLost: the manager's kept token is gone before its
	// cluster was given it.
	reasonKeptTokenLost = "KeptTokenLost"
)

// keptTokenName names the Secret that keeps the token of m.
func keptTokenName(m *machinistv1.Machine) string { return nodes.KeptTokenSecretName(m.UID) }

// DefaultNamespace is the manager's namespace when Reconciler.Namespace
// is empty: where config/default deploys it.
const DefaultNamespace = "machinist-system"

// keptTokens is where the kept tokens' Secrets live.
func (r *Reconciler) keptTokens(m *machinistv1.Machine) client.ObjectKey {
	ns := r.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	return client.ObjectKey{Namespace: ns, Name: keptTokenName(m)}
}

// errKeptTokenRecorded is deferJoin's answer when it has just made the
// kept token: the provider is given it only once the Machine's status
// records it.
var errKeptTokenRecorded = errors.New("a bootstrap token is kept for the machine; the repair goes on once the Machine records it")

// deferJoin returns what the machine of a Machine repaired while its
// cluster cannot be reached joins with: the cluster's address as last
// connected or as its kubeconfig names it, and the token kept for it. The
// first call makes the token, records it in the Machine's status and
// returns errKeptTokenRecorded; later calls return it.
func (r *Reconciler) deferJoin(ctx context.Context, s *step) (bootstrap.Join, error) {
	m := s.m
	server, ca := s.nodes.Address()
	if server == "" {
		return bootstrap.Join{}, errors.New("the manager has neither reached the cluster since it started nor read an API server address in its kubeconfig, so it has no address to give the machine")
	}
	if r.APIReader == nil {
		return bootstrap.Join{}, errors.New("the manager cannot read Secrets past its cache")
	}
	var sec corev1.Secret
	err := r.APIReader.Get(ctx, r.keptTokens(m), &sec)
	switch {
	case apierrors.IsNotFound(err):
		// None yet, or the recorded one was deleted (by someone who may
		// write the manager's namespace): a new one is made. A machine
		// given the old one already cannot join with it, and its repair
		// times out.
		m.Status.KeptToken = nil
		return bootstrap.Join{}, r.keepToken(ctx, s)
	case err != nil:
		return bootstrap.Join{}, fmt.Errorf("reading the kept bootstrap token of Machine %s: %w", m.Name, err)
	}
	t, why := keptToken(&sec, m)
	if why != "" {
		// Not the manager's, or not recorded (a create whose status
		// write was lost): given to no machine. It makes way.
		s.note(corev1.EventTypeWarning, reasonKeptTokenRefused, "Join",
			"Secret %s/%s is not used as the repaired machine's bootstrap token: %s; it is deleted, and the manager makes its own", sec.Namespace, sec.Name, why)
		err := r.Client.Delete(ctx, &sec, client.Preconditions{UID: &sec.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return bootstrap.Join{}, fmt.Errorf("deleting Secret %s, which the manager did not make: %w", sec.Name, err)
		}
		m.Status.KeptToken = nil
		return bootstrap.Join{}, fmt.Errorf("Secret %s/%s under the kept token's name was not the manager's: a token is made on the next look", sec.Namespace, sec.Name)
	}
	return bootstrap.Join{Server: server, CAData: ca, Token: t.Value()}, nil
}

// keepToken makes the kept token's Secret and records it in the
// Machine's status, to be stored by this reconcile's status write.
func (r *Reconciler) keepToken(ctx context.Context, s *step) error {
	m := s.m
	t, err := bootstrap.NewToken()
	if err != nil {
		return err
	}
	// The ID the token is published under, and so the one Joined deletes.
	t.ID = nodes.PublishedTokenID(m.UID)
	key := r.keptTokens(m)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{nodes.TokenMachineLabel: string(m.UID)},
			// For people: an owner reference cannot name a Machine of
			// another namespace. The Machine's deletion deletes it
			// (spent).
			Annotations: map[string]string{nodes.KeptForAnnotation: m.Namespace + "/" + m.Name},
		},
		Type: nodes.KeptTokenSecretType,
		Data: map[string][]byte{keptTokenKey: []byte(t.Value())},
	}
	if err := r.Client.Create(ctx, sec); err != nil {
		// AlreadyExists included: an earlier call's reply was lost, and
		// the next look finds a Secret this Machine does not record.
		// A namespace that does not exist is said as it is: the
		// manager's namespace (--namespace) must be there.
		return fmt.Errorf("keeping the bootstrap token of Machine %s until its cluster answers, in Secret %s/%s: %w", m.Name, key.Namespace, key.Name, err)
	}
	m.Status.KeptToken = &machinistv1.KeptToken{SecretUID: string(sec.UID), TokenID: t.ID}
	s.after(keptTokenRecheck)
	return errKeptTokenRecorded
}

// keptTokenRecheck is how soon a Machine that has just recorded its kept
// token looks again, to give it to the provider: its own status write
// wakes nothing.
const keptTokenRecheck = 100 * time.Millisecond

// keptToken returns the token sec keeps for m if the manager made it for
// m, and otherwise why not.
func keptToken(sec *corev1.Secret, m *machinistv1.Machine) (bootstrap.Token, string) {
	rec := m.Status.KeptToken
	switch {
	case rec == nil:
		return bootstrap.Token{}, "the Machine records no kept token"
	case string(sec.UID) != rec.SecretUID:
		return bootstrap.Token{}, fmt.Sprintf("the Machine records the kept token's Secret as UID %s, and this one is %s: someone else made it", rec.SecretUID, sec.UID)
	case sec.Type != nodes.KeptTokenSecretType:
		return bootstrap.Token{}, fmt.Sprintf("its type is %q, not %q", sec.Type, nodes.KeptTokenSecretType)
	case sec.Labels[nodes.TokenMachineLabel] != string(m.UID):
		return bootstrap.Token{}, fmt.Sprintf("its label %s is not the Machine's UID", nodes.TokenMachineLabel)
	}
	t, err := bootstrap.ParseToken(string(sec.Data[keptTokenKey]))
	if err != nil {
		return bootstrap.Token{}, err.Error()
	}
	// The ID is the one the Machine records, not always the one its UID
	// gives: a Machine moved from another management cluster keeps the
	// token, and its ID, it was given there.
	if t.ID != rec.TokenID {
		return bootstrap.Token{}, fmt.Sprintf("its token ID %s is not the one the Machine records", t.ID)
	}
	return t, ""
}

// publishJoin makes the token kept for a Machine repaired while its
// cluster could not be reached a bootstrap token of that cluster, now that
// it answers. Only a Machine whose status records a kept token not yet
// published is looked at: one read per such Machine once its cluster is
// back, none in a settled fleet. The kept Secret stays until the machine
// has joined (spent), so that a publication whose record was lost is
// made again, harmlessly.
func (r *Reconciler) publishJoin(ctx context.Context, s *step) error {
	m := s.m
	rec := m.Status.KeptToken
	if s.down != nil || r.APIReader == nil || rec == nil || rec.Published {
		return nil
	}
	var sec corev1.Secret
	err := r.APIReader.Get(ctx, r.keptTokens(m), &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading the kept bootstrap token of Machine %s: %w", m.Name, err)
	}
	var t bootstrap.Token
	why := "its Secret " + keptTokenName(m) + " is gone"
	if err == nil {
		t, why = keptToken(&sec, m)
	}
	if why != "" {
		m.Status.KeptToken = nil
		s.note(corev1.EventTypeWarning, reasonKeptTokenLost, "Join",
			"the bootstrap token given to the repaired machine while its cluster could not be reached is not published: %s; the machine cannot join until it is repaired again", why)
		return nil
	}
	if err := s.nodes.Publish(ctx, m, t, r.operationTimeout()+joinSlack); err != nil {
		return fmt.Errorf("publishing the bootstrap token given to the machine of Machine %s while its cluster could not be reached: %w", m.Name, err)
	}
	rec.Published = true
	s.note(corev1.EventTypeNormal, reasonJoinPublished, "Join",
		"the bootstrap token given to the machine while its cluster could not be reached is now the cluster's")
	return nil
}

// spent deletes m's bootstrap tokens once its repaired machine has
// joined: those made in its cluster, the published one among them (its ID
// is one of Joined's), and the Secret that kept it here.
func (r *Reconciler) spent(ctx context.Context, s *step) error {
	m := s.m
	if err := s.nodes.Joined(ctx, m); err != nil {
		return err
	}
	rec := m.Status.KeptToken
	if rec == nil {
		return nil
	}
	key := r.keptTokens(m)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	uid := types.UID(rec.SecretUID)
	err := r.Client.Delete(ctx, sec, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting the kept bootstrap token of Machine %s: %w", m.Name, err)
	}
	m.Status.KeptToken = nil
	return nil
}

// dropUnrecordedKeptToken deletes, with a Machine that goes, the Secret
// under its kept token's name that its status does not record: one made
// for a repair whose status write was lost (a kill -9, a lost reply)
// before a later look could delete it to make way. It was given to no
// machine, but would outlive the Machine. Only a Machine whose last
// operation is a repair can have one, so only such a Machine's deletion
// asks (one DELETE). The name alone is enough: the manager's namespace is
// written by no tenant.
func (r *Reconciler) dropUnrecordedKeptToken(ctx context.Context, m *machinistv1.Machine) error {
	if op := m.Status.Operation; m.Status.KeptToken != nil || op == nil || op.Type != machinistv1.OperationRepair {
		return nil
	}
	key := r.keptTokens(m)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := r.Client.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Secret %s/%s, a bootstrap token kept for Machine %s but never recorded: %w", key.Namespace, key.Name, m.Name, err)
	}
	return nil
}

// The Node: what the Machine records of it and writes to it.

// observeNode copies what the Machine records about its Node.
func observeNode(m *machinistv1.Machine, node *corev1.Node) {
	m.Status.NodeRef = &machinistv1.NodeReference{Name: node.Name, UID: string(node.UID)}
	m.Status.BootID = node.Status.NodeInfo.BootID
	m.Status.NodeInfo = machinistv1.NodeInfoOf(node.Status.NodeInfo)
}

// setHealth writes the NodeHealthy and Ready conditions of a Running Machine.
func setHealth(m *machinistv1.Machine, h nodes.Health) {
	setCondition(m, machinistv1.ConditionNodeHealthy, h)
	setCondition(m, machinistv1.ConditionReady, h)
}

// setCondition sets m's condition t to what h says of its Node.
func setCondition(m *machinistv1.Machine, t string, h nodes.Health) {
	status := metav1.ConditionFalse
	if h.Healthy {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: h.Reason, Message: h.Message, ObservedGeneration: m.Generation,
	})
}

// setUnseenHealth says that the Node's health is not known: its cluster
// cannot be reached. Written once per outage: the message does not change
// while the cluster stays down.
func setUnseenHealth(s *step) {
	for _, t := range []string{machinistv1.ConditionNodeHealthy, machinistv1.ConditionReady} {
		s.unseen(t, metav1.ConditionUnknown, "the Node side is not seen, and nothing is done to the Node until it is")
	}
}

// applyNodeSpec puts the class's and the Machine's labels and taints on the
// Node, and the annotations that name its Machine, writing only when
// something is missing or different. Labels, annotations and taints that
// others set are left alone; an annotation naming another Machine (a
// kubelet may write its own Node's annotations) is put right.
//
// With uncordon, the same patch also makes the Node schedulable again,
// as the end of an operation that drained it; with initialized, it lifts
// the Node's uninitialized taint (initializeNode).
func (r *Reconciler) applyNodeSpec(ctx context.Context, s *step, node *corev1.Node, uncordon, initialized bool) error {
	m := s.m
	tmpl := nodes.TemplateFor(s.class, &m.Spec)
	labels, taints := tmpl.Labels, tmpl.Taints

	// A JSON patch of just what changes. Labels are set key by key, so
	// others' labels stay; taints are one atomic list, so setting them is
	// tested against the list this change was computed from: a taint that
	// the node lifecycle controller, a user or another controller added or
	// removed since the cache saw the Node is never undone by a list from
	// before it (a Conflict, and the change is decided again).
	var p patch.JSON
	setKeys(&p, "/metadata/labels", node.Labels, labels)
	setKeys(&p, "/metadata/annotations", node.Annotations, nodeAnnotations(m))
	want := node.Spec.Taints
	for _, t := range taints {
		want = nodes.SetTaint(want, t)
	}
	if initialized {
		want = nodes.RemoveTaint(want, nodes.Uninitialized)
	}
	if !equalTaints(node.Spec.Taints, want) {
		var had any // a Node without taints has no such field
		if len(node.Spec.Taints) > 0 {
			had = node.Spec.Taints
		}
		p.Test("/spec/taints", had)
		p.Set("/spec/taints", want)
	}
	if uncordon && node.Spec.Unschedulable {
		p.Set("/spec/unschedulable", false)
	}
	if p.Empty() {
		return nil
	}
	return s.nodes.Patch(ctx, node.DeepCopy(), p.Patch())
}

// initializeRetry is how soon a Node's addresses are asked for again
// after the provider failed to give them.
const initializeRetry = 5 * time.Second

// initializeNode does for a Node whose kubelet runs with
// --cloud-provider=external what a cloud controller manager's node
// controller does, when the Machine's provider gives its instance's
// addresses: it puts them on the Node, where kube-apiserver looks for the
// kubelet, and reports that the uninitialized taint may be lifted. A
// provider that gives none leaves the Node to whatever else initializes
// it, such as a cloud controller manager of the user's. One write, once
// in a Node's life; a Node without the taint costs nothing.
func (r *Reconciler) initializeNode(ctx context.Context, s *step, node *corev1.Node) (bool, error) {
	if !nodes.HasTaint(node.Spec.Taints, nodes.Uninitialized) {
		return false, nil
	}
	act, why := r.actuatorFor(s.m, s.class)
	if why != nil {
		return false, nil
	}
	in, err := act.Describe(ctx, s.m.Status.ProviderID)
	if err != nil {
		// The Node waits, tainted: a provider that does not answer must
		// not hold the Machine's health and operations too.
		log.FromContext(ctx).Info("the provider did not give the Node's addresses; asking again", "error", err.Error())
		s.after(initializeRetry)
		return false, nil
	}
	if len(in.Addresses) == 0 {
		return false, nil
	}
	if equality.Semantic.DeepEqual(node.Status.Addresses, in.Addresses) {
		return true, nil
	}
	before := node.DeepCopy()
	node.Status.Addresses = in.Addresses
	// A merge patch sets the list whole: the kubelet's own addresses are
	// not the provider's.
	if err := s.nodes.PatchStatus(ctx, node, client.MergeFrom(before)); err != nil {
		return false, err
	}
	return true, nil
}

// setKeys adds to p what makes the map at path (have, as read) hold
// every key of want with its value, key by key, so that others' keys stay.
func setKeys(p *patch.JSON, path string, have, want map[string]string) {
	for k, v := range want {
		if h, ok := have[k]; ok && h == v {
			continue
		}
		if len(have) == 0 {
			// No map to add a key to: the whole map is set, and, like
			// the taints, only if there is still none, so that keys
			// another writer put on the Node since the cache saw it
			// without any are not replaced by ours alone.
			p.Test(path, nil)
			p.Set(path, want)
			return
		}
		p.Set(path+"/"+patch.Key(k), v)
	}
}

// nodeAnnotations are the annotations that name m on its Node.
func nodeAnnotations(m *machinistv1.Machine) map[string]string {
	a := map[string]string{
		machinistv1.NodeMachineAnnotation:          m.Name,
		machinistv1.NodeClusterNamespaceAnnotation: m.Namespace,
	}
	if m.Spec.ClusterName != "" {
		a[machinistv1.NodeClusterNameAnnotation] = m.Spec.ClusterName
	}
	return a
}

func equalTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].MatchTaint(&b[i]) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}

// deadNode is a Node found not healthy before a hard reboot.
type deadNode struct {
	node *corev1.Node
	why  string
}

// unreachable returns the Machine's Node if it is not healthy, else nil.
func (r *Reconciler) unreachable(ctx context.Context, s *step) (*deadNode, error) {
	node, err := s.nodes.Node(ctx, s.m.Status.ProviderID)
	if err != nil || node == nil {
		return nil, err
	}
	h, err := nodes.Judge(ctx, s.nodes, node, s.now)
	if err != nil || h.Healthy {
		return nil, err
	}
	return &deadNode{node: node, why: h.Message}, nil
}

// forgetDeadBoot deletes, at once, the pods bound to the Node of a Machine
// that was just hard-rebooted without a drain while its Node was not
// healthy. Nothing of the old boot runs any more, and no kubelet is left
// to say so: without this, its pods would stay Running on the API, and
// their controllers would not replace them, until the node lifecycle's
// eviction some minutes later. Mirror pods are the kubelet's own to
// recreate. A healthy Node's kubelet reports its pods itself after the
// reboot, so they are left alone.
func (r *Reconciler) forgetDeadBoot(ctx context.Context, s *step, dead *deadNode) error {
	gone, err := s.nodes.DeletePods(ctx, dead.node)
	if err != nil {
		return fmt.Errorf("deleting the pods of the dead boot: %w", err)
	}
	if gone > 0 {
		s.note(corev1.EventTypeNormal, reasonDeadBoot, "Reboot", "deleted %d pod(s) of node %s that died with its unreachable boot (%s)",
			gone, dead.node.Name, dead.why)
	}
	return nil
}

// confirmBoot checks, once the cluster of a Machine whose last operation
// was completed on its provider's word answers, that its Node reports the
// boot the provider did. A Node still showing the boot before the
// operation has not reported since (stale is true): the next change of it
// wakes the Machine, and meanwhile what the Machine records of its boot is
// the provider's. A mismatch is a Warning Event and BootConfirmed False;
// either way the condition is written once.
func (r *Reconciler) confirmBoot(ctx context.Context, s *step, node *corev1.Node) (stale bool, err error) {
	m := s.m
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionBootConfirmed)
	if c == nil || c.Status != metav1.ConditionUnknown || node == nil {
		return false, nil
	}
	op := m.Status.Operation
	if op == nil || op.ProviderBootID == "" {
		meta.RemoveStatusCondition(&m.Status.Conditions, machinistv1.ConditionBootConfirmed)
		return false, nil
	}
	have := node.Status.NodeInfo.BootID
	if have == "" || have == op.BootID {
		return true, nil
	}
	set := func(status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: machinistv1.ConditionBootConfirmed, Status: status, Reason: reason, Message: message, ObservedGeneration: m.Generation,
		})
	}
	if have != op.ProviderBootID {
		msg := fmt.Sprintf("after %s %s the provider reported boot ID %s, and Node %s now reports %s: the machine booted again since, or the provider's word was wrong",
			operation.Verb(op.Type), op.ID, op.ProviderBootID, node.Name, have)
		set(metav1.ConditionFalse, machinistv1.ReasonBootIDMismatch, msg)
		s.note(corev1.EventTypeWarning, machinistv1.ReasonBootIDMismatch, "Confirm", "%s", msg)
		return false, nil
	}
	if op.Type == machinistv1.OperationRepair {
		// The re-imaged machine has joined: its token is spent.
		if err := r.spent(ctx, s); err != nil {
			return false, err
		}
	}
	set(metav1.ConditionTrue, machinistv1.ReasonBootIDMatches,
		fmt.Sprintf("Node %s reports boot ID %s, as the provider did after %s %s", node.Name, have, operation.Verb(op.Type), op.ID))
	return false, nil
}

// abort gives the operation up and returns a drained Machine to service.
func (r *Reconciler) abort(ctx context.Context, s *step, why string) outcome {
	node, err := s.nodes.Node(ctx, s.m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	if node != nil {
		// Not applyNodeSpec: the drain may have cordoned the Node in
		// this very reconcile, and the cached Node, not showing it yet,
		// would make uncordoning look needless. A patch that changes
		// nothing writes nothing. It comes before the move, so that a
		// Node that could not be uncordoned is tried again, not left
		// cordoned under a Running Machine.
		if err := s.nodes.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":null}}`))); err != nil {
			return fail(err)
		}
	}
	if operation.InFlight(s.m.Status.Operation) {
		endOperation(s, machinistv1.OperationFailed, why)
	}
	meta.RemoveStatusCondition(&s.m.Status.Conditions, machinistv1.ConditionDrained)
	return settle(phases.Abort)
}

// hooks lists, sorted, m's annotations with prefix: the hooks holding it
// before a drain (PreDrainHookPrefix) or before its instance goes
// (PreTerminateHookPrefix).
func hooks(m *machinistv1.Machine, prefix string) []string {
	var out []string
	for k := range m.Annotations {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
