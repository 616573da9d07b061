package clusters

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/nodes"
)

var (
	kubeconfigCA = []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
	joinCA       = []byte("-----BEGIN CERTIFICATE-----\njoin\n-----END CERTIFICATE-----\n")
)

func machineOf(key types.NamespacedName) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: "m"},
		Spec:       machinistv1.MachineSpec{ClusterName: key.Name},
	}
}

// given is the address For hands a new machine of key's cluster:
// its connection's, or the one its NotConnectedError carries.
func given(t *testing.T, r *Registry, key types.NamespacedName) (string, []byte) {
	t.Helper()
	c, err := r.For(context.Background(), machineOf(key))
	if err != nil {
		nc, ok := nodes.NotConnected(err)
		if !ok {
			t.Fatalf("For: %v", err)
		}
		return nc.Server, nc.CAData
	}
	return c.(*nodes.API).Address()
}

func want(t *testing.T, r *Registry, key types.NamespacedName, server string, ca []byte, why string) {
	t.Helper()
	s, c := given(t, r, key)
	if s != server || string(c) != string(ca) {
		t.Errorf("%s: a new machine is given %q with CA %q, want %q with %q", why, s, c, server, ca)
	}
}

// A cluster that cannot be reached: its Machines are given the
// joinEndpoint, with the kubeconfig's CA unless it names its own, and
// the kubeconfig's address once it is taken out.
func TestAnUnreachableClusterGivesItsJoinEndpoint(t *testing.T) {
	r, err := NewRegistry(Options{Local: &nodes.API{}, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.ctx = context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "far"}

	// Before any kubeconfig is read, a joinEndpoint without a CA has no
	// CA to go with it: no address is given rather than one unverified.
	r.Fail(key, machinistv1.ReasonKubeconfigSecretMissing, context.DeadlineExceeded)
	r.SetJoinEndpoint(key, &machinistv1.JoinEndpoint{Server: "https://10.0.0.10:6443"})
	want(t, r, key, "", nil, "no kubeconfig read, a joinEndpoint without CA")
	r.SetJoinEndpoint(key, &machinistv1.JoinEndpoint{Server: "https://10.0.0.10:6443", CertificateAuthorityData: joinCA})
	want(t, r, key, "https://10.0.0.10:6443", joinCA, "no kubeconfig read, a joinEndpoint with its CA")

	// A kubeconfig read, whose server does not answer.
	kc := kubeconfig(t, func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
		c.Server, c.CertificateAuthorityData = "https://127.0.0.1:1", kubeconfigCA
	})
	if err := r.Connect(context.Background(), key, kc); err == nil {
		t.Fatal("connected to a server that is not there")
	}
	want(t, r, key, "https://10.0.0.10:6443", joinCA, "a joinEndpoint with its CA")
	r.SetJoinEndpoint(key, &machinistv1.JoinEndpoint{Server: "https://10.0.0.10:6443"})
	want(t, r, key, "https://10.0.0.10:6443", kubeconfigCA, "a joinEndpoint without CA")
	r.SetJoinEndpoint(key, nil)
	want(t, r, key, "https://127.0.0.1:1", kubeconfigCA, "no joinEndpoint")
}

// A connected cluster: a changed joinEndpoint is given at once, in a new
// nodes.API; one handed out before keeps its address.
func TestAConnectedClusterGivesItsJoinEndpoint(t *testing.T) {
	r, err := NewRegistry(Options{Local: &nodes.API{}})
	if err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "near"}
	r.addresses[key] = address{server: "https://public.example:6443", ca: kubeconfigCA}
	r.conns[key] = &conn{host: "https://public.example:6443", cluster: &nodes.API{Server: "https://public.example:6443", CAData: kubeconfigCA}}
	before, err := r.For(context.Background(), machineOf(key))
	if err != nil {
		t.Fatal(err)
	}
	want(t, r, key, "https://public.example:6443", kubeconfigCA, "no joinEndpoint")
	r.SetJoinEndpoint(key, &machinistv1.JoinEndpoint{Server: "https://10.0.0.10:6443"})
	want(t, r, key, "https://10.0.0.10:6443", kubeconfigCA, "a joinEndpoint without CA")
	r.SetJoinEndpoint(key, &machinistv1.JoinEndpoint{Server: "https://10.0.0.10:6443", CertificateAuthorityData: joinCA})
	want(t, r, key, "https://10.0.0.10:6443", joinCA, "a joinEndpoint with its CA")
	if s, _ := before.(*nodes.API).Address(); s != "https://public.example:6443" {
		t.Errorf("the nodes.API handed out before the change now gives %s", s)
	}
	r.SetJoinEndpoint(key, nil)
	want(t, r, key, "https://public.example:6443", kubeconfigCA, "the joinEndpoint taken out")
	if got := r.conns[key].host; got != "https://public.example:6443" {
		t.Errorf("the connection's own server became %s", got)
	}
}
