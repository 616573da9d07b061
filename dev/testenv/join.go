package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// Join makes a fresh bootstrap token for this cluster, stores its Secret
// (described by opts: its expiration, labels) and returns what a machine
// joins this cluster with: the API server, the CA bundle that verifies
// it, and the token. A test hands it to nodeagent.Join or to a provider.
// Tests that need no particular token use JoinData.
func (e *Env) Join(ctx context.Context, opts bootstrap.TokenOptions) (bootstrap.Join, error) {
	token, err := bootstrap.NewToken()
	if err != nil {
		return bootstrap.Join{}, err
	}
	if opts.Description == "" {
		opts.Description = "a test's machine"
	}
	if err := e.Client.Create(ctx, bootstrap.TokenSecret(token, opts)); err != nil {
		return bootstrap.Join{}, fmt.Errorf("testenv: storing bootstrap token %s: %w", token, err)
	}
	return bootstrap.Join{Server: e.Config.Host, CAData: e.Config.CAData, Token: token.Value()}, nil
}

// JoinData is Join for one test: a bootstrap token of t's own, deleted
// when t ends, since a token left in a control plane that many tests share
// would let anyone holding it join long after. It fails t when the token
// cannot be stored or deleted.
func (e *Env) JoinData(t testing.TB) bootstrap.Join {
	t.Helper()
	j, err := e.Join(context.Background(), bootstrap.TokenOptions{Description: "test " + t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		token, err := bootstrap.ParseToken(j.Token)
		if err != nil {
			t.Error(err)
			return
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: token.SecretName()}}
		// The token cleaner may have deleted an expired one already.
		if err := e.Client.Delete(context.Background(), secret); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting bootstrap token %s: %v", token, err)
		}
	})
	return j
}

// joinTimeout bounds a join: kube-controller-manager, started with the
// control plane, may still be coming up when the first test asks.
const joinTimeout = time.Minute

// NodeCredentials joins this cluster with j (from JoinData) as the
// machine named nodeName, as a kubelet's TLS bootstrap does (nodeagent.Join:
// a CertificateSigningRequest that kube-controller-manager approves and
// signs), and returns the node's own credentials. Tests of what a machine
// does act with them rather than as an administrator, so that the Node
// authorizer and NodeRestriction judge them as they judge a kubelet. It
// fails t when the join does.
func (e *Env) NodeCredentials(t testing.TB, j bootstrap.Join, nodeName string) nodeagent.Credentials {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	// kube-apiserver knows a token by a cache of kube-system's Secrets: one
	// used at once may be refused until the cache has it, and a kubelet
	// retries, as nodeagent.Bootstrap does.
	for {
		creds, err := nodeagent.Join(ctx, j, nodeName, nil)
		if err == nil {
			return creds
		}
		if !apierrors.IsUnauthorized(err) || ctx.Err() != nil {
			t.Fatalf("joining as node %s: %v", nodeName, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NodeClient joins this cluster as the machine named nodeName with join
// data of its own (JoinData, NodeCredentials) and returns a client that
// acts as system:node:<nodeName>, for a test that needs nothing but a
// machine's view of its cluster.
func (e *Env) NodeClient(t testing.TB, nodeName string) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(e.NodeCredentials(t, e.JoinData(t), nodeName).Config())
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// ClusterCA is the PEM of the CA that the cluster's client certificates,
// a joined machine's among them, are signed by.
func (e *Env) ClusterCA() []byte { return e.ca.CertPEM() }
