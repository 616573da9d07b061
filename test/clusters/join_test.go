package clusters

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
)

// A WorkloadCluster whose joinEndpoint is a TCP proxy in front of its
// kube-apiserver, while the manager's kubeconfig names the kube-apiserver
// itself: its Machines are given the proxy's address, with the
// kubeconfig's CA (the joinEndpoint names none), and join through it.
// Once the joinEndpoint is taken out, the next Machine is given the
// kubeconfig's address again.
func TestJoinEndpointIsWhereMachinesJoin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "join-endpoint")
	w, wc := ownCluster(t, ns, "fronted")
	direct := strings.TrimSuffix(w.Config.Host, "/")
	proxy := startTCPProxy(t, direct)

	// A provider that records each Machine's join data, then creates its
	// instance as the inmemory provider does.
	rec := &joinRecorder{Provider: ctrls.Provider, joins: map[string]providers.Join{}}
	name := "join-recorder-" + ns
	if err := ctrls.Register(name, rec); err != nil {
		t.Fatal(err)
	}
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "recorded"},
		Spec:       machinistv1.MachineClassSpec{Provider: name},
	}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}

	// A change reaches the registry on the controller's next reconcile,
	// woken by the new generation, which it then records as observed:
	// the Machines made after that are given the new address.
	setJoin := func(patch string, set bool) {
		t.Helper()
		if err := env.Client.Patch(ctx, wc, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
		testenv.WaitForObject(t, env.Client, 30*time.Second, "the WorkloadCluster's new generation observed", wc, func(wc *machinistv1.WorkloadCluster) error {
			if (wc.Spec.JoinEndpoint != nil) != set || wc.Status.ObservedGeneration != wc.Generation {
				return fmt.Errorf("joinEndpoint %+v, generation %d observed %d", wc.Spec.JoinEndpoint, wc.Generation, wc.Status.ObservedGeneration)
			}
			return nil
		})
	}
	setJoin(fmt.Sprintf(`{"spec":{"joinEndpoint":{"server":%q}}}`, proxy.url), true)
	ms := testenv.MachineSet(ns, "fronted", 2)
	ms.Spec.Template.Spec.ClusterName = wc.Name
	ms.Spec.Template.Spec.ClassRef.Name = class.Name
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	machines := running(t, ns, 2, 2*time.Minute, client.MatchingLabels{"pool": ms.Name})

	for i := range machines {
		m := &machines[i]
		j, ok := rec.join(m.Name)
		if !ok {
			t.Fatalf("Machine %s was created with no join data recorded", m.Name)
		}
		if j.Server != proxy.url {
			t.Errorf("Machine %s was told to join %s, want the joinEndpoint %s", m.Name, j.Server, proxy.url)
		}
		if !bytes.Equal(j.CAData, w.Config.CAData) {
			t.Errorf("Machine %s was given a CA other than its kubeconfig's (%d bytes, want %d)", m.Name, len(j.CAData), len(w.Config.CAData))
		}
		if nodeOf(t, "", m.Status.ProviderID) != nil {
			t.Errorf("Machine %s has a Node in the management cluster", m.Name)
		}
		if !hasNode(t, w, m.Status.ProviderID) {
			t.Errorf("Machine %s has no Node in its cluster", m.Name)
		}
	}
	// No one but the machines knows the proxy's address: the manager
	// reaches the cluster at its kubeconfig's. Each machine's join and
	// the client it then keeps (its Node's status and Lease) went
	// through it.
	if n := proxy.accepted.Load(); n < int64(len(machines)) {
		t.Errorf("the proxy carried %d connections, want at least one per machine (%d)", n, len(machines))
	} else {
		t.Logf("the proxy carried %d connections, %d bytes up and %d down", n, proxy.up.Load(), proxy.down.Load())
	}
	var seen machinistv1.WorkloadCluster
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(wc), &seen); err != nil {
		t.Fatal(err)
	}
	if seen.Status.Server != direct {
		t.Errorf("status.server is %s, want the kubeconfig's %s: the manager's own address", seen.Status.Server, direct)
	}

	// Taken out, the kubeconfig's address is given again: the next
	// Machine joins the kube-apiserver directly.
	setJoin(`{"spec":{"joinEndpoint":null}}`, false)
	if err := env.Client.Patch(ctx, ms, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`))); err != nil {
		t.Fatal(err)
	}
	for _, m := range running(t, ns, 3, 2*time.Minute, client.MatchingLabels{"pool": ms.Name}) {
		j, ok := rec.join(m.Name)
		if !ok {
			t.Fatalf("Machine %s was created with no join data recorded", m.Name)
		}
		if isOld(machines, m.Name) {
			continue
		}
		if j.Server != direct {
			t.Errorf("Machine %s, made after the joinEndpoint was taken out, was told to join %s, want the kubeconfig's %s", m.Name, j.Server, direct)
		}
	}
}

// hasNode reports whether cluster w has a Node of providerID.
func hasNode(t *testing.T, w *testenv.Env, providerID string) bool {
	t.Helper()
	k, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := k.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodes.Items {
		if nodes.Items[i].Spec.ProviderID == providerID {
			return true
		}
	}
	return false
}

func isOld(ms []machinistv1.Machine, name string) bool {
	for i := range ms {
		if ms[i].Name == name {
			return true
		}
	}
	return false
}

// joinRecorder is the inmemory provider, keeping each Machine's join
// data as Create is given it.
type joinRecorder struct {
	testenv.Provider
	mu    sync.Mutex
	joins map[string]providers.Join
}

func (p *joinRecorder) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	p.mu.Lock()
	p.joins[m.Name] = join
	p.mu.Unlock()
	return p.Provider.Create(ctx, m, class, join)
}

func (p *joinRecorder) join(machine string) (providers.Join, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	j, ok := p.joins[machine]
	return j, ok
}

// tcpProxy passes TCP connections through to a kube-apiserver, TLS and
// all, and counts them: the API server's own certificate is what its
// clients verify, so its CA verifies the proxy's address as long as the
// certificate covers the proxy's host (127.0.0.1).
type tcpProxy struct {
	url                string
	accepted, up, down atomic.Int64
}

func startTCPProxy(t *testing.T, upstream string) *tcpProxy {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{url: "https://" + l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { p.pass(c, u.Host) })
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// counting is a writer that counts what it writes.
type counting struct {
	w io.Writer
	n *atomic.Int64
}

func (c counting) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// pass copies both ways until either side ends, then closes both.
func (p *tcpProxy) pass(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(counting{u, &p.up}, c)
		_ = u.Close()
		_ = c.Close()
	}()
	_, _ = io.Copy(counting{c, &p.down}, u)
	_ = c.Close()
	_ = u.Close()
	<-done
}
