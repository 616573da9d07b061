package lifecycle

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/nodes"
)

// A repair while the Machine's cluster cannot be reached hands the
// re-imaged machine a bootstrap token its cluster does not hold yet. Until
// the cluster answers, the token is kept in a Secret beside the Machine in
// the management cluster, owned by the Machine, so that a manager that
// restarts meanwhile hands the same token to a retried call and publishes
// it when the cluster is back. The machine's agent, like a kubelet, keeps
// asking for its certificate until the token is accepted.

// deferredTokenKey is the key of the token in that Secret.
const deferredTokenKey = "token"

// deferredJoinName names the Secret that keeps the token of the Machine
// with this UID: the UID makes it unique, whatever the Machine's name.
func deferredJoinName(m *machinistv1.Machine) string { return "machinist-join-" + string(m.UID) }

// deferJoin returns what the machine of a Machine repaired while its
// cluster cannot be reached joins with: the cluster's address as last
// connected or as its kubeconfig names it, and the token kept for it (made
// on the first call).
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
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: deferredJoinName(m)}, &sec)
	if apierrors.IsNotFound(err) {
		t, err := bootstrap.NewToken()
		if err != nil {
			return bootstrap.Join{}, err
		}
		t.ID = nodes.PublishedTokenID(m.UID)
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: m.Namespace, Name: deferredJoinName(m),
				Labels: map[string]string{nodes.TokenMachineLabel: string(m.UID)},
				// Gone with the Machine, should it go before its
				// cluster is back.
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: machinistv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID,
					BlockOwnerDeletion: ptr.To(false),
				}},
			},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{deferredTokenKey: []byte(t.Value())},
		}
		if err := r.Client.Create(ctx, &sec); err != nil {
			// AlreadyExists included: an earlier call's reply was
			// lost; the next look reads what it made.
			return bootstrap.Join{}, fmt.Errorf("keeping the bootstrap token of Machine %s until its cluster answers: %w", m.Name, err)
		}
	} else if err != nil {
		return bootstrap.Join{}, fmt.Errorf("reading the kept bootstrap token of Machine %s: %w", m.Name, err)
	}
	t, err := bootstrap.ParseToken(string(sec.Data[deferredTokenKey]))
	if err != nil {
		return bootstrap.Join{}, fmt.Errorf("secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	return bootstrap.Join{Server: server, CAData: ca, Token: t.Value()}, nil
}

// publishJoin makes the token kept for a Machine repaired while its
// cluster could not be reached a bootstrap token of that cluster, now that
// it answers, and then forgets it here. Only a Machine whose Node side was
// last unseen is looked at: one read per such Machine once its cluster is
// back, none in a settled fleet.
func (r *Reconciler) publishJoin(ctx context.Context, s *step) error {
	m := s.m
	if s.down != nil || r.APIReader == nil || !unseenHealth(m) {
		return nil
	}
	var sec corev1.Secret
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: deferredJoinName(m)}, &sec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the kept bootstrap token of Machine %s: %w", m.Name, err)
	}
	t, err := bootstrap.ParseToken(string(sec.Data[deferredTokenKey]))
	if err == nil {
		err = s.nodes.Publish(ctx, m, t, r.operationTimeout()+joinSlack)
	}
	if err != nil {
		return fmt.Errorf("publishing the bootstrap token given to the machine of Machine %s while its cluster could not be reached: %w", m.Name, err)
	}
	s.note(corev1.EventTypeNormal, reasonJoinPublished, "Join",
		"the bootstrap token given to the machine while its cluster could not be reached is now the cluster's")
	err = r.Client.Delete(ctx, &sec, client.Preconditions{UID: &sec.UID})
	return client.IgnoreNotFound(err)
}
