package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/nodes"
)

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

// keptTokenName names the Secret that keeps the token of the Machine
// with this UID: the UID makes it unique, whatever the Machine's name
// and namespace.
func keptTokenName(m *machinistv1.Machine) string { return "machinist-join-" + string(m.UID) }

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
			Annotations: map[string]string{keptForAnnotation: m.Namespace + "/" + m.Name},
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

// keptForAnnotation names, on a kept token's Secret, the Machine it is
// kept for.
const keptForAnnotation = "machinist.dev/kept-for"

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
	if t.ID != rec.TokenID || t.ID != nodes.PublishedTokenID(m.UID) {
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
