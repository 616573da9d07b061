// Package bootstraptoken makes and deletes bootstrap tokens: Secrets in
// kube-system that kube-apiserver's bootstrap token authenticator accepts
// as the user system:bootstrap:<id>, in the group system:bootstrappers.
package bootstraptoken

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Token is a bootstrap token. Its secret is a credential: String is the
// whole token, for the one place it is handed over, and nothing else
// prints it.
type Token struct {
	ID, Secret string
}

// String is the token as a client presents it, "<id>.<secret>".
func (k Token) String() string { return k.ID + "." + k.Secret }

// User is who kube-apiserver says a request with the token comes from.
func (k Token) User() string { return "system:bootstrap:" + k.ID }

// Parse splits a token into its ID and secret.
func Parse(token string) (Token, error) {
	id, secret, ok := strings.Cut(token, ".")
	if !ok || len(id) != 6 || len(secret) != 16 {
		return Token{}, fmt.Errorf("a bootstrap token is <6 characters>.<16 characters>")
	}
	return Token{ID: id, Secret: secret}, nil
}

// alphabet is what bootstrap token IDs and secrets are made of.
const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func random(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		// 256 is not a multiple of 36; the slight bias leaves a secret of
		// 16 characters far beyond guessing.
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// Create makes a bootstrap token for authentication only, valid for ttl,
// in the extra groups given besides system:bootstrappers.
func Create(ctx context.Context, kube kubernetes.Interface, ttl time.Duration, description string, groups ...string) (Token, error) {
	id, err := random(6)
	if err != nil {
		return Token{}, err
	}
	secret, err := random(16)
	if err != nil {
		return Token{}, err
	}
	data := map[string]string{
		"token-id":                       id,
		"token-secret":                   secret,
		"expiration":                     time.Now().Add(ttl).UTC().Format(time.RFC3339),
		"usage-bootstrap-authentication": "true",
		"description":                    description,
	}
	if len(groups) > 0 {
		data["auth-extra-groups"] = strings.Join(groups, ",")
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: data,
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return Token{}, fmt.Errorf("making bootstrap token %s: %w", id, err)
	}
	return Token{ID: id, Secret: secret}, nil
}

// Delete deletes the token; one that is gone is no error.
func Delete(ctx context.Context, kube kubernetes.Interface, id string) error {
	err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, "bootstrap-token-"+id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token %s: %w", id, err)
	}
	return nil
}
