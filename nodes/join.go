package nodes

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// TokenMachineLabel marks a bootstrap token's Secret with the UID of the
// Machine it was made for, so that it is found again, and deleted once the
// Machine's machine has joined.
const TokenMachineLabel = "machinist.dev/machine-uid"

// KeptTokenSecretType is the type of the Secret, in the manager's own
// namespace of the management cluster, that keeps the bootstrap token of
// a machine repaired while its cluster could not be reached. The type alone proves nothing
// (anyone who may create Secrets may give one any type); the Machine's
// status records the Secret the manager made.
const KeptTokenSecretType corev1.SecretType = "machinist.dev/kept-bootstrap-token"

// tokenIDs is how many token IDs a Machine may try: its ID is derived from
// its UID, so that a reconcile that lost its reply finds the token it
// made, and a collision with another Machine's moves to the next.
const tokenIDs = 4

// Join returns what m's machine joins its cluster with, making m's
// bootstrap token (valid for ttl) unless a live one is there.
func (l *API) Join(ctx context.Context, m *machinistv1.Machine, ttl time.Duration) (bootstrap.Join, error) {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	for i := range tokenIDs {
		id := tokenID(m.UID, i)
		s, err := secrets.Get(ctx, bootstrap.Token{ID: id}.SecretName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			t, err := bootstrap.NewToken()
			if err != nil {
				return bootstrap.Join{}, err
			}
			t.ID = id
			_, err = secrets.Create(ctx, bootstrap.TokenSecret(t, bootstrap.TokenOptions{
				Expiration:  time.Now().Add(ttl),
				Description: fmt.Sprintf("joins the machine of Machine %s/%s", m.Namespace, m.Name),
				Labels:      map[string]string{TokenMachineLabel: string(m.UID)},
			}), metav1.CreateOptions{})
			if err != nil {
				// AlreadyExists included: a reconcile of the same
				// Machine raced this one; the next look finds its token.
				return bootstrap.Join{}, fmt.Errorf("making the bootstrap token of Machine %s: %w", m.Name, err)
			}
			return l.join(t), nil
		case err != nil:
			return bootstrap.Join{}, fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
		case s.Labels[TokenMachineLabel] != string(m.UID):
			continue // another Machine's, or a person's
		}
		t, err := bootstrap.TokenFromSecret(s)
		if err != nil {
			return bootstrap.Join{}, err
		}
		if expired(s, time.Now().Add(time.Minute)) {
			// Too late to join with: the token cleaner deletes it soon.
			// A new one is made on the next look.
			err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return bootstrap.Join{}, err
			}
			return bootstrap.Join{}, fmt.Errorf("the bootstrap token of Machine %s had expired; a new one is made", m.Name)
		}
		return l.join(t), nil
	}
	return bootstrap.Join{}, fmt.Errorf("the %d bootstrap token IDs of Machine %s are all taken by other tokens", tokenIDs, m.Name)
}

// Joined deletes m's bootstrap tokens: its machine has joined, or never
// will. None being there is no error.
//
// Each token ID m may hold is read by name and its Secret deleted if it is
// m's. A deletecollection by m's label would be one request, but
// kube-apiserver serves it by reading every Secret of kube-system, and
// while thousands of machines join at once that is thousands of tokens
// read per Machine: a ninth of kube-apiserver's CPU in a scale-up of
// 10,000. The reads are consistent, not from kube-apiserver's watch
// cache: a Machine deleted as it starts provisioning reads its token
// milliseconds after making it.
func (l *API) Joined(ctx context.Context, m *machinistv1.Machine) error {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	for i := range tokenIDs + 1 {
		name := bootstrap.Token{ID: tokenID(m.UID, i)}.SecretName()
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
		case s.Labels[TokenMachineLabel] != string(m.UID):
			continue // another Machine's, or a person's
		}
		err = secrets.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting the bootstrap token of Machine %s: %w", m.Name, err)
		}
	}
	return nil
}

// PublishedTokenID is the ID of the token kept for m's machine while its
// cluster could not be reached, then published (Publish): a slot of its
// own after those Join tries, so that Joined finds it by name too.
func PublishedTokenID(uid types.UID) string { return tokenID(uid, tokenIDs) }

// Address implements Cluster.
func (l *API) Address() (string, []byte) { return l.Server, l.CAData }

// Publish implements Cluster.
func (l *API) Publish(ctx context.Context, m *machinistv1.Machine, t bootstrap.Token, ttl time.Duration) error {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	_, err := secrets.Create(ctx, bootstrap.TokenSecret(t, bootstrap.TokenOptions{
		Expiration:  time.Now().Add(ttl),
		Description: fmt.Sprintf("joins the machine of Machine %s/%s, given while the cluster could not be reached", m.Namespace, m.Name),
		Labels:      map[string]string{TokenMachineLabel: string(m.UID)},
	}), metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("making the bootstrap token of Machine %s: %w", m.Name, err)
		}
		return nil
	}
	// Made by an earlier attempt whose reply was lost, or another's.
	s, err := secrets.Get(ctx, t.SecretName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
	}
	if have, err := bootstrap.TokenFromSecret(s); err != nil || have != t || s.Labels[TokenMachineLabel] != string(m.UID) {
		return fmt.Errorf("the bootstrap token ID %s of Machine %s is taken by another token", t.ID, m.Name)
	}
	return nil
}

func (l *API) join(t bootstrap.Token) bootstrap.Join {
	return bootstrap.Join{Server: l.Server, CAData: l.CAData, Token: t.Value()}
}

// tokenID is the i-th token ID of the Machine with this UID: six
// characters of [a-z0-9].
func tokenID(uid types.UID, i int) string {
	sum := sha256.Sum256([]byte(string(uid) + "/" + strconv.Itoa(i)))
	id := strconv.FormatUint(binary.BigEndian.Uint64(sum[:8]), 36)
	return strings.Repeat("0", max(0, 6-len(id))) + id[:min(6, len(id))]
}

// expired reports whether the token Secret's expiration is before t.
func expired(s *corev1.Secret, t time.Time) bool {
	at, err := time.Parse(time.RFC3339, string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	return err == nil && at.Before(t)
}
