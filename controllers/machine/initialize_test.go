package machine_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// addressing is a provider that gives the instances of the Machine named
// addressed the addresses addrs, as a cloud provider gives an instance's,
// and none to the others.
// Those of the Machine named failing it gives too, once it has failed
// to answer for them while their Node was tainted, as a provider that is
// away for a while.
type addressing struct {
	providers.Actuator
	addressed, failing string
	addrs              []corev1.NodeAddress
	failed             *atomic.Int32
	tainted            func(name string) bool
}

func (a addressing) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	in, err := a.Actuator.Describe(ctx, providerID)
	if err != nil {
		return in, err
	}
	_, name, _, err := providers.ParseProviderID(inmemory.Name, providerID)
	switch {
	case err != nil:
	case name == a.failing && a.failed.Load() < 2 && a.tainted(name):
		a.failed.Add(1)
		return providers.Instance{}, providers.Unavailable(errors.New("the provider is away"))
	case name == a.addressed || name == a.failing:
		in.Addresses = a.addrs
	}
	return in, nil
}

// statusWrites counts the manager's writes of each Node's status.
type statusWrites struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

func (s *statusWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPatch || req.Method == http.MethodPut {
		s.mu.Lock()
		s.n[req.URL.Path]++
		s.mu.Unlock()
	}
	return s.next.RoundTrip(req)
}

func (s *statusWrites) of(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n["/api/v1/nodes/"+node+"/status"]
}

// TestANodeAwaitingItsCloudProviderGetsTheProvidersAddresses: a kubelet
// run with --cloud-provider=external registers its Node with the
// uninitialized taint. When the Machine's provider gives the instance's
// addresses, the Machine controller, acting as the manager's own role,
// writes them to the Node's status in place of the kubelet's and lifts
// the taint: one write of the status, none once done. When it gives
// none, the Node is left to whatever else initializes it: the taint stays.
// When it fails to answer, the controller asks again after a while.
func TestANodeAwaitingItsCloudProviderGetsTheProvidersAddresses(t *testing.T) {
	e, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()
	if err := e.CreateClusterRoles(ctx, "role.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "machinist-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-manager"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "machinist-system", Name: "machinist-manager"}},
	}); err != nil {
		t.Fatal(err)
	}
	p, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: leaseSeconds, RenewInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeInternalDNS, Address: "b.example.com"}}
	registry := providers.NewRegistry()
	failed := &atomic.Int32{}
	var taintedNodes sync.Map // Machine name: its Node is tainted
	tainted := func(name string) bool { _, ok := taintedNodes.Load(name); return ok }
	if err := registry.Register(inmemory.Name, addressing{Actuator: p, addressed: "b", failing: "c", addrs: addrs,
		failed: failed, tainted: tainted}); err != nil {
		t.Fatal(err)
	}
	writes := &statusWrites{n: map[string]int{}}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:machinist-system:machinist-manager",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:machinist-system", "system:authenticated"},
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { writes.next = rt; return writes })
	c, err := e.StartControllersVia(cfg, manager.Options{
		Actuators: registry,
		Backoff:   machine.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
		DrainPoll: 200 * time.Millisecond,
	}, testenv.Leases{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })

	ns := e.NewNamespace(t, "cloud", testenv.Small)
	running := map[string]*machinistv1.Machine{}
	for _, name := range []string{"a", "b", "c"} {
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, Version: "v1.37.2"},
		}
		if err := e.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, time.Minute, "Machine "+name+" Running on its Node", func() bool {
			return e.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil &&
				m.Status.Phase == machinistv1.MachineRunning && m.Status.NodeRef != nil
		})
		running[name] = m
	}
	// Both Nodes as a kubelet run with --cloud-provider=external
	// registers them.
	taint := []byte(`{"spec":{"taints":[{"key":"` + nodes.Uninitialized + `","value":"true","effect":"NoSchedule"}]}}`)
	for name, m := range running {
		taintedNodes.Store(name, true)
		if err := e.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Status.NodeRef.Name}}, client.RawPatch(types.MergePatchType, taint)); err != nil {
			t.Fatal(err)
		}
	}
	b := running["b"].Status.NodeRef.Name
	var node corev1.Node
	testenv.WaitFor(t, 30*time.Second, "Node "+b+" given its provider's addresses and its taint lifted", func() bool {
		return e.Client.Get(ctx, client.ObjectKey{Name: b}, &node) == nil && !nodes.HasTaint(node.Spec.Taints, nodes.Uninitialized) &&
			len(node.Status.Addresses) == len(addrs) && node.Status.Addresses[0] == addrs[0] && node.Status.Addresses[1] == addrs[1]
	})
	// Settled: nothing more is written.
	time.Sleep(2 * time.Second)
	if n := writes.of(b); n != 1 {
		t.Errorf("the manager wrote Node %s's status %d times, want once", b, n)
	}
	// A provider away twice: the Node is initialized all the same, by
	// the controller's own retry (nothing about the Node changes).
	cn := running["c"].Status.NodeRef.Name
	testenv.WaitFor(t, 30*time.Second, "Node "+cn+" initialized once its provider answers", func() bool {
		return e.Client.Get(ctx, client.ObjectKey{Name: cn}, &node) == nil && !nodes.HasTaint(node.Spec.Taints, nodes.Uninitialized) &&
			len(node.Status.Addresses) == len(addrs) && node.Status.Addresses[0] == addrs[0]
	})
	if n := failed.Load(); n != 2 {
		t.Errorf("the provider failed %d times, want 2", n)
	}
	a := running["a"].Status.NodeRef.Name
	if err := e.Client.Get(ctx, client.ObjectKey{Name: a}, &node); err != nil {
		t.Fatal(err)
	}
	if !nodes.HasTaint(node.Spec.Taints, nodes.Uninitialized) {
		t.Errorf("Node %s, whose provider gives no addresses, lost its uninitialized taint: that is its cloud provider's to lift", a)
	}
	if n := writes.of(a); n != 0 {
		t.Errorf("the manager wrote Node %s's status %d times, want never", a, n)
	}
}
