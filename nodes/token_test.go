package nodes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/nodes"
)

// A Machine's bootstrap token lives in the API, not in the manager: a
// manager killed after it made the token and before the provider was asked
// to create the instance (or one whose reply was lost) finds the same
// token at its next look, and makes no second one. A token of another
// Machine that happens to hold its ID is left alone; one too close to its
// expiry is replaced; Joined deletes them all.
func TestAMachinesTokenIsFoundAgainAfterARestart(t *testing.T) {
	ctx := context.Background()
	kube, host := workload(t)
	manager := func() *nodes.API { return &nodes.API{Kube: kube, Server: host} }
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m", UID: "6a1f0c3e-0000-4000-8000-000000000001"}}
	tokens := func() []corev1.Secret {
		list, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: nodes.TokenMachineLabel + "=" + string(m.UID)})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}

	first, err := manager().Join(ctx, m, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The manager is gone; a new one, with nothing in memory, looks again.
	again, err := manager().Join(ctx, m, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if again.Token != first.Token {
		t.Errorf("a restarted manager made a second token: %s, then %s", first.Token, again.Token)
	}
	if n := len(tokens()); n != 1 {
		t.Errorf("%d token Secrets for one Machine, want 1", n)
	}

	// A token that is not the Machine's (a person's, another Machine's)
	// on its first ID: the Machine moves to its next ID and leaves that
	// token alone.
	other := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other", UID: "6a1f0c3e-0000-4000-8000-000000000002"}}
	taken, err := manager().Join(ctx, other, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := manager().Joined(ctx, other); err != nil {
		t.Fatal(err)
	}
	squatter, err := bootstrap.ParseToken(taken.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx,
		bootstrap.TokenSecret(squatter, bootstrap.TokenOptions{Expiration: time.Now().Add(time.Hour), Description: "a person's"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	theirs, err := manager().Join(ctx, other, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if theirs.Token == squatter.Value() || strings.HasPrefix(theirs.Token, squatter.ID+".") {
		t.Fatalf("Machine %s was handed a token that is not its own: %s", other.Name, theirs.Token)
	}

	// Too close to its expiry to join with: replaced by a new token.
	mine, err := bootstrap.ParseToken(first.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, mine.SecretName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := manager().Join(ctx, m, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := manager().Join(ctx, m, time.Hour); err == nil || !strings.Contains(err.Error(), "had expired") {
		t.Fatalf("a token with 30s left was handed out again: %v", err)
	}
	fresh, err := manager().Join(ctx, m, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Token == first.Token {
		t.Error("the replaced token came back")
	}

	if err := manager().Joined(ctx, m); err != nil {
		t.Fatal(err)
	}
	if n := len(tokens()); n != 0 {
		t.Errorf("%d token Secrets left after Joined", n)
	}
	for _, tok := range []string{theirs.Token, squatter.Value()} {
		parsed, err := bootstrap.ParseToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, parsed.SecretName(), metav1.GetOptions{}); err != nil {
			t.Errorf("Joined of one Machine touched a token not its own: %v", err)
		}
	}
}

// A token kept for a Machine repaired while its cluster was down is
// published once it answers. A second publication, as after a lost reply,
// finds its own token and succeeds; a token of the same ID that is not the
// Machine's (another Machine's, or another secret) is refused, not taken.
func TestAKeptTokenIsPublishedOnce(t *testing.T) {
	ctx := context.Background()
	kube, host := workload(t)
	cluster := &nodes.API{Kube: kube, Server: host}
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m", UID: "6a1f0c3e-0000-4000-8000-000000000003"}}
	kept, err := bootstrap.ParseToken("k3pt01.0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := cluster.Publish(ctx, m, kept, time.Hour); err != nil {
			t.Fatalf("publishing the kept token: %v", err)
		}
	}
	s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, kept.SecretName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := bootstrap.TokenFromSecret(s); err != nil || got != kept || s.Labels[nodes.TokenMachineLabel] != string(m.UID) {
		t.Errorf("the published token: %v %v, labels %v", got, err, s.Labels)
	}

	// The same ID for another Machine, and another secret for this one.
	other := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other", UID: "6a1f0c3e-0000-4000-8000-000000000004"}}
	impostor, err := bootstrap.ParseToken("k3pt01.fedcba9876543210")
	if err != nil {
		t.Fatal(err)
	}
	for _, try := range []struct {
		m *machinistv1.Machine
		t bootstrap.Token
	}{{other, kept}, {m, impostor}} {
		err := cluster.Publish(ctx, try.m, try.t, time.Hour)
		if err == nil || !strings.Contains(err.Error(), "is taken by another token") {
			t.Errorf("publishing %s for Machine %s over another's: %v", try.t, try.m.Name, err)
		}
	}
	if s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, kept.SecretName(), metav1.GetOptions{}); err != nil || s.Labels[nodes.TokenMachineLabel] != string(m.UID) {
		t.Errorf("the first token was changed: %v %v", err, s.Labels)
	}

	// A kept token takes the Machine's published slot, which Joined reads
	// by name: once the machine has joined, it goes.
	slot, err := bootstrap.ParseToken(nodes.PublishedTokenID(m.UID) + ".0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Publish(ctx, m, slot, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Joined(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, slot.SecretName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the published token is still there after Joined: %v", err)
	}

	// A token of an ID the Machine's UID does not give, as one kept for
	// it before it was moved from another management cluster: Joined
	// reads it by the ID the Machine records, and deletes it only if it
	// is the Machine's. Another Machine recording the same ID leaves it.
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, kept.SecretName(), metav1.GetOptions{}); err != nil {
		t.Fatalf("Joined deleted a token of an ID the Machine does not record: %v", err)
	}
	other.Status.KeptToken = &machinistv1.KeptToken{TokenID: kept.ID, Published: true}
	if err := cluster.Joined(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, kept.SecretName(), metav1.GetOptions{}); err != nil {
		t.Fatalf("Joined of another Machine recording the ID deleted this one's token: %v", err)
	}
	m.Status.KeptToken = &machinistv1.KeptToken{TokenID: kept.ID, Published: true}
	if err := cluster.Joined(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, kept.SecretName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the token of the recorded ID is still there after Joined: %v", err)
	}
}

// workload starts a workload cluster for the test and returns an admin
// client of it and its API server's address.
func workload(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	w, err := testenv.StartWith(testenv.Options{Workload: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return kubernetes.NewForConfigOrDie(w.Config), w.Config.Host
}
