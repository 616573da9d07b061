package clusters

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// A cluster whose kube-controller-manager approves no certificate
// requests: within a minute of their creation, its Machines say on their
// Ready condition that their certificate request was not approved, and
// what to look at; waiting so, each is written at most once more (the
// machine's own report giving way to its cluster's Joinable condition,
// or the other way round), not once per look.
func TestAMachineSaysItsCertificateWasNotApproved(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := startCluster(t, testenv.Options{Lacks: testenv.Lacks{Approver: true}})
	ns := env.NewNamespace(t, "not-approved", testenv.Small)
	register(t, w, ns, "no-approver")
	ms := testenv.MachineSet(ns, "workers", 2)
	ms.Spec.Template.Spec.ClusterName = "no-approver"
	created := time.Now()
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	var machines []machinistv1.Machine
	testenv.WaitFor(t, time.Minute, "both Machines saying their certificate was not approved", func() error {
		var err error
		machines, err = testenv.ListMachines(ctx, env.Client, ns, client.MatchingLabels{"pool": "workers"})
		if err != nil {
			return err
		}
		if len(machines) != 2 {
			return fmt.Errorf("%d Machines", len(machines))
		}
		for _, m := range machines {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
			if c == nil || c.Reason != machinistv1.ReasonJoinCertificateNotApproved {
				return fmt.Errorf("Machine %s: Ready %+v", m.Name, c)
			}
		}
		return nil
	})
	for _, m := range machines {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		t.Logf("Machine %s after %s: %s %s: %s", m.Name, time.Since(created).Round(100*time.Millisecond), c.Status, c.Reason, c.Message)
		if m.Status.Phase != machinistv1.MachineProvisioning {
			t.Errorf("Machine %s is %s, want Provisioning", m.Name, m.Status.Phase)
		}
		if !strings.Contains(c.Message, "certificatesigningrequest-approving-controller") {
			t.Errorf("Machine %s's Ready message does not name the approver: %s", m.Name, c.Message)
		}
	}

	changes, err := env.WatchMachines(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	window := 45 * time.Second // three looks of each Machine
	time.Sleep(window)         // a window of writes counted, not a wait for a state
	written := map[string]int{}
	for _, e := range drain(changes) {
		if e.Type == watch.Error {
			t.Fatalf("the watch of Machines failed: %+v", e.Object)
		}
		if m, ok := e.Object.(*machinistv1.Machine); ok {
			written[m.Name]++
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
			t.Logf("Machine %s %s: Ready %s: %s", m.Name, e.Type, c.Reason, c.Message)
		}
	}
	for _, m := range machines {
		if written[m.Name] > 1 {
			t.Errorf("Machine %s, waiting for a certificate, was written %d times in %s", m.Name, written[m.Name], window)
		}
	}
}

// A join endpoint machines cannot reach: the cluster is Joinable, as the
// manager reaches it, but a Machine says, from its machine's own report,
// that it cannot reach the address it was given, and names it. While its
// provider then fails to answer, the Machine keeps what it said,
// unwritten.
func TestAMachineSaysItCannotReachItsJoinEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startCluster(t, testenv.Options{})
	ns := env.NewNamespace(t, "join-unreachable", testenv.Small)
	wc := register(t, w, ns, "walled")
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + l.Addr().String()
	_ = l.Close()
	patch := fmt.Sprintf(`{"spec":{"joinEndpoint":{"server":%q}}}`, closed)
	if err := env.Client.Patch(ctx, wc, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the join endpoint observed", wc, func(wc *machinistv1.WorkloadCluster) error {
		if wc.Status.ObservedGeneration != wc.Generation {
			return fmt.Errorf("generation %d observed %d", wc.Generation, wc.Status.ObservedGeneration)
		}
		return nil
	})
	// The inmemory provider, whose Describe can be made to fail.
	name := "describe-faults-" + ns
	prov := &describeFaults{Provider: ctrls.Provider, scheme: name}
	if err := ctrls.Register(name, prov); err != nil {
		t.Fatal(err)
	}
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "faulty"},
		Spec:       machinistv1.MachineClassSpec{Provider: name},
	}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}
	ms := testenv.MachineSet(ns, "workers", 1)
	ms.Spec.Template.Spec.ClusterName = wc.Name
	ms.Spec.Template.Spec.ClassRef.Name = class.Name
	created := time.Now()
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	var m machinistv1.Machine
	testenv.WaitFor(t, time.Minute, "the Machine saying it cannot reach its join endpoint", func() error {
		machines, err := testenv.ListMachines(ctx, env.Client, ns)
		if err != nil {
			return err
		}
		if len(machines) != 1 {
			return fmt.Errorf("%d Machines", len(machines))
		}
		m = machines[0]
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		if c == nil || c.Reason != machinistv1.ReasonJoinServerUnreachable {
			return fmt.Errorf("Machine %s: Ready %+v", m.Name, c)
		}
		return nil
	})
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
	t.Logf("Machine %s after %s: %s: %s", m.Name, time.Since(created).Round(100*time.Millisecond), c.Reason, c.Message)
	if !strings.Contains(c.Message, closed) || !strings.Contains(c.Message, "joinEndpoint") {
		t.Errorf("the Ready message names neither the address nor the field that set it: %s", c.Message)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(wc), wc); err != nil {
		t.Fatal(err)
	}
	if j := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable); j != nil && j.Status == metav1.ConditionFalse {
		t.Errorf("the manager reaches the cluster, yet it is not Joinable: %s", j.Message)
	}

	// The provider fails to answer: the Machine keeps what it was told,
	// unwritten, rather than flicker back to Provisioning and again.
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes, err := env.WatchMachines(watchCtx, ns)
	if err != nil {
		t.Fatal(err)
	}
	before := prov.asked.Load()
	prov.failing.Store(true)
	time.Sleep(35 * time.Second) // two looks and more, a window of writes counted
	asked := prov.asked.Load() - before
	t.Logf("the provider was asked %d times before it failed, %d while", before, asked)
	prov.failing.Store(false)
	for _, e := range drain(changes) {
		if m, ok := e.Object.(*machinistv1.Machine); ok {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
			t.Errorf("Machine %s written while its provider failed: Ready %s: %s", m.Name, c.Reason, c.Message)
		}
	}
	if asked < 2 {
		t.Errorf("the provider was asked %d times in 35 s, want a look every 15 s", asked)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&m), &m); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c.Reason != machinistv1.ReasonJoinServerUnreachable {
		t.Errorf("after the provider's failures, Ready is %s: %s", c.Reason, c.Message)
	}
}

// describeFaults is the inmemory provider under a scheme of its own, so
// that the Machine controller calls it by its instances' providerIDs too,
// whose Describe fails while failing is set.
type describeFaults struct {
	testenv.Provider
	scheme  string
	failing atomic.Bool
	asked   atomic.Int32
}

func (p *describeFaults) inner(id string) string {
	return inmemory.Name + strings.TrimPrefix(id, p.scheme)
}

func (p *describeFaults) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	id, err := p.Provider.Create(ctx, m, class, join)
	if err != nil {
		return "", err
	}
	return p.scheme + strings.TrimPrefix(id, inmemory.Name), nil
}

func (p *describeFaults) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	p.asked.Add(1)
	if p.failing.Load() {
		return providers.Instance{}, errors.New("the provider's API is down")
	}
	return p.Provider.Describe(ctx, p.inner(providerID))
}

func (p *describeFaults) Exists(ctx context.Context, providerID string) (bool, error) {
	return p.Provider.Exists(ctx, p.inner(providerID))
}

func (p *describeFaults) Delete(ctx context.Context, providerID string) error {
	return p.Provider.Delete(ctx, p.inner(providerID))
}

func (p *describeFaults) FindByUID(ctx context.Context, uid types.UID) (string, error) {
	id, err := p.Provider.FindByUID(ctx, uid)
	if id == "" || err != nil {
		return id, err
	}
	return p.scheme + strings.TrimPrefix(id, inmemory.Name), nil
}
