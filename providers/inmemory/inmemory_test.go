package inmemory_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

var (
	env       *testenv.Env
	clientset kubernetes.Interface
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) {
		env = e
		clientset = kubernetes.NewForConfigOrDie(e.Config)
	}))
}

const (
	renew = 500 * time.Millisecond
	wait  = 20 * time.Second
)

func newProvider(t *testing.T) *inmemory.Provider {
	t.Helper()
	p, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: 3, RenewInterval: renew, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// machine creates a namespace (if needed), a MachineClass with providerSpec
// and a Machine of that class in the real apiserver, so UIDs are real.
func machine(t *testing.T, namespace, name, providerSpec string, mutate ...func(*machinistv1.Machine, *machinistv1.MachineClass)) (*machinistv1.Machine, *machinistv1.MachineClass) {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := env.Client.Create(ctx, ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-class"},
		Spec:       machinistv1.MachineClassSpec{Provider: inmemory.Name},
	}
	if providerSpec != "" {
		class.Spec.ProviderSpec = runtime.RawExtension{Raw: []byte(providerSpec)}
	}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: machinistv1.MachineSpec{
			ClassRef: machinistv1.ClassReference{Name: class.Name},
			Version:  "v1.37.2",
		},
	}
	for _, f := range mutate {
		f(m, class)
	}
	g.Expect(env.Client.Create(ctx, class)).To(Succeed())
	g.Expect(env.Client.Create(ctx, m)).To(Succeed())
	return m, class
}

// joins keeps each test's join data, so that a test calling Create in a
// loop makes one token.
var joins sync.Map // *testing.T → providers.Join

// join is the test's join data, made on the first call.
func join(t *testing.T) providers.Join {
	t.Helper()
	if j, ok := joins.Load(t); ok {
		return j.(providers.Join)
	}
	j := env.JoinData(t)
	joins.Store(t, j)
	t.Cleanup(func() { joins.Delete(t) })
	return j
}

// certificatesFor lists the nodes a token's user asked certificates for
// and was given them, one entry per CertificateSigningRequest.
func certificatesFor(g Gomega, j providers.Join) []string {
	k, err := bootstrap.ParseToken(j.Token)
	g.Expect(err).NotTo(HaveOccurred())
	csrs, err := clientset.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, csr := range csrs.Items {
		if csr.Spec.Username != k.User() || len(csr.Status.Certificate) == 0 {
			continue
		}
		block, _ := pem.Decode(csr.Spec.Request)
		g.Expect(block).NotTo(BeNil())
		req, err := x509.ParseCertificateRequest(block.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		names = append(names, req.Subject.CommonName)
	}
	return names
}

func nodeFor(g Gomega, p *inmemory.Provider, providerID string) *corev1.Node {
	name, err := p.NodeName(providerID)
	g.Expect(err).NotTo(HaveOccurred())
	n, err := clientset.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func renewTime(g Gomega, node string) time.Time {
	l, err := clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return l.Spec.RenewTime.Time
}

func TestCreateIsIdempotentAndNodesAreUniqueAcrossNamespaces(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "idem-a", "worker", "", func(_ *machinistv1.Machine, c *machinistv1.MachineClass) {
		c.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")}}
	})

	// Racing calls for one Machine, as a controller with retries makes them,
	// must still make one instance.
	ids := make([]string, 5)
	errs := make([]error, 5)
	var wg sync.WaitGroup
	j := join(t)
	for i := range ids {
		wg.Go(func() { ids[i], errs[i] = p.Create(ctx, m, class, j) })
	}
	wg.Wait()
	g.Expect(errs).To(HaveEach(Succeed()))
	g.Expect(ids[0]).To(HavePrefix("inmemory:///idem-a/worker/"))
	g.Expect(ids).To(HaveEach(ids[0]))
	again, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(ids[0]))

	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, ids[0])
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
		g.Expect(n.Spec.ProviderID).To(Equal(ids[0]))
		g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.37.2"))
		cpu := n.Status.Capacity[corev1.ResourceCPU]
		g.Expect(cpu.String()).To(Equal("16"))
	}).WithTimeout(wait).Should(Succeed())
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	count := 0
	for _, n := range nodes.Items {
		if n.Spec.ProviderID == ids[0] {
			count++
		}
	}
	g.Expect(count).To(Equal(1))

	// The same Machine name in another namespace is another Node.
	other, otherClass := machine(t, "idem-b", "worker", "")
	otherID, err := p.Create(ctx, other, otherClass, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(otherID).NotTo(Equal(ids[0]))
	n1, _ := p.NodeName(ids[0])
	n2, _ := p.NodeName(otherID)
	g.Expect(n1).NotTo(Equal(n2))
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(nodeFor(g, p, otherID))).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
}

func TestLongMachineNameGivesValidNodeName(t *testing.T) {
	g := NewWithT(t)
	p := newProvider(t)
	m, class := machine(t, "longname", strings.Repeat("a", 70)+"-b.c", "")
	id, err := p.Create(context.Background(), m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	name, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(name)).To(BeNumerically("<=", 63))
	g.Eventually(func(g Gomega) {
		g.Expect(nodeFor(g, p, id).Labels).To(HaveKeyWithValue(corev1.LabelHostname, name))
	}).WithTimeout(wait).Should(Succeed())
}

// TestAdoptionHandsNoMachineAnotherMachinesInstance: a Machine of
// another namespace naming a live Machine's instance in spec.providerID is
// refused, permanently and without learning whose it is, and the instance
// stays its Machine's, untouched; its own Machine naming it gets it back.
func TestAdoptionHandsNoMachineAnotherMachinesInstance(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	orig, class := machine(t, "adopt-a", "orig", "")
	id, err := p.Create(ctx, orig, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(nodeFor(g, p, id))).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	before, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(before.Owner).To(Equal(providers.Owner{Namespace: "adopt-a", Name: "orig", UID: orig.UID}), "Create records the Machine it made the instance for")
	g.Expect(before.Power).To(Equal(providers.PowerOn))

	thief, thiefClass := machine(t, "adopt-b", "thief", "", func(m *machinistv1.Machine, _ *machinistv1.MachineClass) {
		m.Spec.ProviderID = id
	})
	_, err = p.Create(ctx, thief, thiefClass, env.JoinData(t))
	g.Expect(err).To(HaveOccurred())
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "no retry hands the instance over: %v", err)
	g.Expect(providers.IsTaken(err)).To(BeTrue(), "%v", err)
	for _, secret := range []string{"adopt-a", "orig", string(orig.UID)} {
		g.Expect(err.Error()).NotTo(ContainSubstring(secret), "the refusal tells whose the instance is")
	}

	after, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after).To(Equal(before), "still the original Machine's, on the same boot")
	g.Expect(p.Restarts(id)).To(Equal(0))
	g.Expect(p.FindByUID(ctx, thief.UID)).To(BeEmpty(), "the refused Machine has no instance, whose Delete would destroy the original's")
	g.Expect(p.FindByUID(ctx, orig.UID)).To(Equal(id))
	g.Expect(p.Instances()).To(Equal([]string{id}))

	// The original Machine naming its own instance is a repeated call.
	self := orig.DeepCopy()
	self.Spec.ProviderID = id
	for range 2 {
		g.Expect(p.Create(ctx, self, class, join(t))).To(Equal(id))
	}
	g.Expect(p.Restarts(id)).To(Equal(0), "re-adopting its own instance restarted it")
	g.Expect(p.BootID(id)).To(Equal(before.BootID))

	stranger, strangerClass := machine(t, "adopt-b", "stranger", "", func(m *machinistv1.Machine, _ *machinistv1.MachineClass) {
		m.Spec.ProviderID = "inmemory:///adopt-b/ghost/00000000-0000-0000-0000-000000000000"
	})
	_, err = p.Create(ctx, stranger, strangerClass, join(t))
	g.Expect(err).To(HaveOccurred())
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "adopting an unknown instance cannot succeed later: %v", err)
	g.Expect(providers.IsTaken(err)).To(BeFalse(), "a missing instance is no one's: %v", err)
}

// TestAdoptingAnUnownedInstance: an instance made outside Machinist
// belongs to no Machine until one adopts it; then it boots and joins with
// that Machine's join data, is that Machine's (Describe, FindByUID), and
// no other Machine's.
func TestAdoptingAnUnownedInstance(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	id, err := p.MakeUnowned("racked", "rack-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(id).To(HavePrefix("inmemory:///racked/rack-1/"))
	g.Expect(p.Describe(ctx, id)).To(Equal(providers.Instance{Power: providers.PowerOff}), "off, and no one's")
	g.Expect(p.Instances()).To(Equal([]string{id}))

	adopter, class := machine(t, "adopt-u", "adopter", "", func(m *machinistv1.Machine, _ *machinistv1.MachineClass) {
		m.Spec.ProviderID = id
		m.Spec.Version = "v1.36.1"
	})
	theirs := join(t)
	g.Expect(p.Create(ctx, adopter, class, theirs)).To(Equal(id))
	in, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(in.Owner).To(Equal(providers.OwnerOf(adopter)))
	g.Expect(p.FindByUID(ctx, adopter.UID)).To(Equal(id))
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, id)
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
		g.Expect(n.Spec.ProviderID).To(Equal(id))
		g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.36.1"), "it runs the adopter's version")
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(certificatesFor(g, theirs)).To(Equal([]string{"system:node:" + node}), "it joined with the adopter's join data")
	boot, err := p.BootID(id)
	g.Expect(err).NotTo(HaveOccurred())

	// The adopter's Create again: the same instance, nothing redone.
	g.Expect(p.Create(ctx, adopter, class, theirs)).To(Equal(id))
	g.Expect(p.BootID(id)).To(Equal(boot))
	g.Expect(p.Restarts(id)).To(Equal(0))

	// Adopted, it is no longer free for another.
	late, lateClass := machine(t, "adopt-v", "late", "", func(m *machinistv1.Machine, _ *machinistv1.MachineClass) {
		m.Spec.ProviderID = id
	})
	_, err = p.Create(ctx, late, lateClass, env.JoinData(t))
	g.Expect(providers.IsPermanent(err) && providers.IsTaken(err)).To(BeTrue(), "%v", err)
	g.Expect(err.Error()).NotTo(ContainSubstring("adopter"))
	g.Expect(p.FindByUID(ctx, late.UID)).To(BeEmpty())
	g.Expect(p.Describe(ctx, id)).To(HaveField("Owner", providers.OwnerOf(adopter)))

	g.Expect(p.Delete(ctx, id)).To(Succeed())
	g.Expect(p.FindByUID(ctx, adopter.UID)).To(BeEmpty(), "a deleted instance is not found")
	g.Expect(p.Instances()).To(BeEmpty())
}

// TestControlMakesUnownedInstances: the control handler makes for an
// out-of-process provider what MakeUnowned makes in process.
func TestControlMakesUnownedInstances(t *testing.T) {
	g := NewWithT(t)
	p := newProvider(t)
	srv := httptest.NewServer(p.ControlHandler())
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/unowned", "application/json", strings.NewReader(`{"namespace":"racked","name":"rack-2"}`))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	var out inmemory.Unowned
	g.Expect(json.NewDecoder(resp.Body).Decode(&out)).To(Succeed())
	g.Expect(out.ProviderID).To(HavePrefix("inmemory:///racked/rack-2/"))
	g.Expect(p.Instances()).To(Equal([]string{out.ProviderID}))
	g.Expect(p.Describe(context.Background(), out.ProviderID)).To(HaveField("Owner", BeZero()))

	bad, err := http.Post(srv.URL+"/unowned", "application/json", strings.NewReader(`{"namespace":"a/b","name":"x"}`))
	g.Expect(err).NotTo(HaveOccurred())
	_ = bad.Body.Close()
	g.Expect(bad.StatusCode).To(Equal(http.StatusBadRequest), "a namespace no providerID can carry")
}

func TestFailNextIsTransient(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "failnext", "m", "")
	p.FailNext(2)
	for range 2 {
		_, err := p.Create(ctx, m, class, join(t))
		g.Expect(err).To(MatchError(inmemory.ErrTransient))
		g.Expect(providers.IsPermanent(err)).To(BeFalse())
	}
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())

	p.FailNext(1)
	g.Expect(p.Delete(ctx, id)).To(MatchError(inmemory.ErrTransient))
	exists, err := p.Exists(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists).To(BeTrue(), "a failed Delete deleted nothing")
	g.Expect(p.Delete(ctx, id)).To(Succeed())
}

func TestErrorRate(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	always, alwaysClass := machine(t, "errorrate", "always", `{"errorRate": 1}`)
	for range 3 {
		_, err := p.Create(ctx, always, alwaysClass, join(t))
		g.Expect(err).To(MatchError(inmemory.ErrTransient))
		g.Expect(providers.IsPermanent(err)).To(BeFalse())
	}

	// With failCreate as well, no call ever creates anything, so every call
	// rolls the dice: about half must fail transiently, the rest reach
	// failCreate.
	half, halfClass := machine(t, "errorrate", "half", `{"errorRate": 0.5, "failCreate": "no"}`)
	transient := 0
	for range 200 {
		_, err := p.Create(ctx, half, halfClass, join(t))
		g.Expect(err).To(HaveOccurred())
		if errors.Is(err, inmemory.ErrTransient) {
			g.Expect(providers.IsPermanent(err)).To(BeFalse())
			transient++
		} else {
			g.Expect(providers.IsPermanent(err)).To(BeTrue())
		}
	}
	g.Expect(transient).To(BeNumerically("~", 100, 40))

	// Delete rolls the error rate of the class the instance was made from.
	some, someClass := machine(t, "errorrate", "some", `{"errorRate": 0.5}`)
	var id string
	g.Eventually(func() error {
		var err error
		id, err = p.Create(ctx, some, someClass, join(t))
		return err
	}).WithTimeout(wait).WithPolling(time.Millisecond).Should(Succeed())
	g.Expect(p.FindByUID(ctx, some.UID)).To(Equal(id), "found by the Machine's UID")
	g.Expect(p.FindByUID(ctx, "some-other-uid")).To(BeEmpty())
	g.Eventually(func() error {
		err := p.Delete(ctx, id)
		if err != nil {
			g.Expect(err).To(MatchError(inmemory.ErrTransient))
		}
		return err
	}).WithTimeout(wait).WithPolling(time.Millisecond).Should(Succeed())
	exists, err := p.Exists(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists).To(BeFalse())
	g.Expect(p.FindByUID(ctx, some.UID)).To(BeEmpty(), "a deleted instance is not found")
}

func TestFailCreateIsPermanent(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "failcreate", "m", `{"failCreate": "quota exceeded"}`)
	_, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).To(MatchError(ContainSubstring("quota exceeded")))
	g.Expect(providers.IsPermanent(err)).To(BeTrue())

	// Set on the Provider instead of the class.
	m2, class2 := machine(t, "failcreate", "m2", "")
	p.SetFaults(inmemory.ProviderSpec{FailCreate: "out of capacity"})
	_, err = p.Create(ctx, m2, class2, join(t))
	g.Expect(providers.IsPermanent(err)).To(BeTrue())
	g.Expect(err).To(MatchError(ContainSubstring("out of capacity")))
	p.SetFaults(inmemory.ProviderSpec{})
	_, err = p.Create(ctx, m2, class2, join(t))
	g.Expect(err).NotTo(HaveOccurred())
}

func TestBadProviderSpecIsPermanent(t *testing.T) {
	g := NewWithT(t)
	p := newProvider(t)
	for i, spec := range []string{`{"createLatencyy": "1s"}`, `{"errorRate": 2}`, `{"createLatency": "soon"}`, `{"neverReady": "yes"}`} {
		m, class := machine(t, "badspec", fmt.Sprintf("m%d", i), spec)
		_, err := p.Create(context.Background(), m, class, join(t))
		g.Expect(err).To(HaveOccurred(), spec)
		g.Expect(providers.IsPermanent(err)).To(BeTrue(), spec)
		g.Expect(err.Error()).To(ContainSubstring("providerSpec"))
	}
	_, err := inmemory.ParseProviderSpec([]byte(`{"createLatencyy": "1s"}`))
	g.Expect(err).To(MatchError(ContainSubstring(`unknown field "createLatencyy"`)))
	spec, err := inmemory.ParseProviderSpec([]byte(`{"createLatency":"2s","errorRate":0.5,"neverReady":true,"failCreate":"quota exceeded"}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(spec).To(Equal(inmemory.ProviderSpec{CreateLatency: metav1.Duration{Duration: 2 * time.Second}, ErrorRate: 0.5, NeverReady: true, FailCreate: "quota exceeded"}))
}

func TestCreateLatency(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "latency", "m", `{"createLatency": "1500ms"}`)

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := p.Create(short, m, class, join(t))
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(time.Since(began)).To(BeNumerically("<", time.Second), "a cancelled Create returns at once")

	began = time.Now()
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(time.Since(began)).To(BeNumerically(">=", 1500*time.Millisecond), "the cancelled call created nothing, so this one waits in full")
	began = time.Now()
	again, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(id))
	g.Expect(time.Since(began)).To(BeNumerically("<", time.Second), "an existing instance is returned without latency")
}

func TestNeverReady(t *testing.T) {
	g := NewWithT(t)
	p := newProvider(t)
	m, class := machine(t, "neverready", "m", `{"neverReady": true}`)
	id, err := p.Create(context.Background(), m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(nodeFor(g, p, id))).To(Equal(corev1.ConditionFalse))
	}).WithTimeout(wait).Should(Succeed())
}

func TestRebootAndRepairChangeBootID(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "reboot", "m", "")
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())

	bootOnNode := func(g Gomega) string {
		n := nodeFor(g, p, id)
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
		return n.Status.NodeInfo.BootID
	}
	var boot string
	g.Eventually(func(g Gomega) { boot = bootOnNode(g) }).WithTimeout(wait).Should(Succeed())
	g.Expect(boot).NotTo(BeEmpty())

	// A label someone else put on the Node survives a reboot, not a repair.
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = clientset.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"added":"by-hand"}}}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	for i, op := range []struct {
		name  string
		do    func(context.Context, string, providers.Operation) error
		keeps bool
	}{{"reboot", p.Reboot, true}, {"repair", p.Repair, false}} {
		opID := providers.Operation{ID: op.name + "-1", Join: join(t)}
		g.Expect(op.do(ctx, id, opID)).To(Succeed(), op.name)
		g.Eventually(func(g Gomega) {
			g.Expect(bootOnNode(g)).NotTo(Equal(boot))
		}).WithTimeout(wait).Should(Succeed(), op.name)
		now, err := p.BootID(id)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(bootOnNode(g)).To(Equal(now), op.name)
		boot = now
		n := nodeFor(g, p, id)
		if op.keeps {
			g.Expect(n.Labels).To(HaveKeyWithValue("added", "by-hand"), op.name)
		} else {
			g.Expect(n.Labels).NotTo(HaveKey("added"), "a re-imaged machine registers its Node afresh")
		}

		// The same operation again is not a second restart.
		g.Expect(op.do(ctx, id, opID)).To(Succeed(), op.name)
		restarts, err := p.Restarts(id)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(restarts).To(Equal(i+1), op.name)
		g.Expect(p.BootID(id)).To(Equal(boot), op.name)
	}

	err = p.Reboot(ctx, "inmemory:///reboot/ghost/0000", providers.Operation{ID: "x"})
	g.Expect(providers.IsPermanent(err)).To(BeTrue())
}

func TestBrokenStaysNotReadyThroughRebootAndRepair(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "broken", "m", "")
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(nodeFor(g, p, id))).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	before, err := p.BootID(id)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(p.Break(id)).To(Succeed())
	boot := before
	for _, op := range []struct {
		name string
		do   func(context.Context, string, providers.Operation) error
	}{{"break", nil}, {"reboot", p.Reboot}, {"repair", p.Repair}} {
		if op.do != nil {
			g.Expect(op.do(ctx, id, providers.Operation{ID: op.name, Join: join(t)})).To(Succeed())
		}
		g.Eventually(func(g Gomega) {
			n := nodeFor(g, p, id)
			g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(boot), "after %s the machine booted again", op.name)
			g.Expect(readyStatus(n)).To(Equal(corev1.ConditionFalse), "after %s the Node is not Ready", op.name)
		}).WithTimeout(wait).Should(Succeed())
		boot, err = p.BootID(id)
		g.Expect(err).NotTo(HaveOccurred())
	}
}

func TestUpdateRunsTheNewVersionOnTheSameNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	g.Expect(p.InPlace(providers.Change{Version: true})).To(BeTrue())
	g.Expect(p.InPlace(providers.Change{Class: true})).To(BeFalse())
	m, class := machine(t, "update", "m", "")
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	var before *corev1.Node
	g.Eventually(func(g Gomega) {
		before = nodeFor(g, p, id)
		g.Expect(readyStatus(before)).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())

	op := providers.Operation{ID: "update-1", Version: "v1.38.0"}
	g.Expect(p.Update(ctx, id, op)).To(Succeed())
	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, id)
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(before.Status.NodeInfo.BootID))
		g.Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
		g.Expect(n.UID).To(Equal(before.UID), "the same Node")
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(p.Update(ctx, id, op)).To(Succeed())
	g.Expect(p.Restarts(id)).To(Equal(1), "once per operation ID")

	// A provider without an image for the version refuses, permanently,
	// and the machine runs on.
	m, class = machine(t, "update-refused", "m", `{"failUpdate":"no image"}`)
	id, err = p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	err = p.Update(ctx, id, providers.Operation{ID: "update-2", Version: "v1.38.0"})
	g.Expect(providers.IsPermanent(err)).To(BeTrue())
	g.Expect(err.Error()).To(ContainSubstring("no image"))
	g.Expect(p.Restarts(id)).To(Equal(0))
}

func TestRebootLatencyKeepsTheMachineOff(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "reboot-latency", "m", `{"rebootLatency":"2s"}`)
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) { renewTime(g, node) }).WithTimeout(wait).Should(Succeed())
	before, err := p.BootID(id)
	g.Expect(err).NotTo(HaveOccurred())

	start := time.Now()
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "r"})).To(Succeed())
	g.Expect(time.Since(start)).To(BeNumerically("<", time.Second), "Reboot returns while the machine is off")
	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, id)
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(before))
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(time.Since(start)).To(BeNumerically(">=", 2*time.Second))
}

func TestCrashStopsLeaseButInstanceExists(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "crash", "m", "")
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	var first time.Time
	g.Eventually(func(g Gomega) { first = renewTime(g, node) }).WithTimeout(wait).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, node)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed())

	g.Expect(p.Crash(id)).To(Succeed())
	stopped := renewTime(g, node)
	g.Consistently(func(g Gomega) time.Time { return renewTime(g, node) }).
		WithTimeout(4 * renew).WithPolling(renew / 4).Should(Equal(stopped))
	exists, err := p.Exists(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists).To(BeTrue(), "a crashed machine is not a deleted one")

	// Power-cycling brings it back.
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "power-cycle"})).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, node)).To(BeTemporally(">", stopped))
	}).WithTimeout(wait).Should(Succeed())
}

func TestDelete(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "delete", "m", "")
	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) { renewTime(g, node) }).WithTimeout(wait).Should(Succeed())

	g.Expect(p.Delete(ctx, id)).To(Succeed())
	exists, err := p.Exists(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists).To(BeFalse())
	g.Expect(p.Delete(ctx, id)).To(Succeed(), "deleting a deleted instance is fine")
	stopped := renewTime(g, node)
	g.Consistently(func(g Gomega) time.Time { return renewTime(g, node) }).
		WithTimeout(4 * renew).WithPolling(renew / 4).Should(Equal(stopped))

	// After Delete the Machine's UID is free: Create makes a new instance.
	id2, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(id2).To(Equal(id), "the providerID derives from the Machine")
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, node)).To(BeTemporally(">", stopped))
	}).WithTimeout(wait).Should(Succeed())

	_, err = p.Exists(ctx, "aws:///us-east-1/i-123")
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "another provider's ID is a caller bug")
	g.Expect(p.Delete(ctx, "inmemory:///delete/never/1234")).To(Succeed(), "an instance never made is already gone")
}

func TestAgentsRunTheirOwnPods(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	var nodes []string
	for i := range 3 {
		m, class := machine(t, "pods", fmt.Sprintf("m%d", i), "")
		id, err := p.Create(ctx, m, class, join(t))
		g.Expect(err).NotTo(HaveOccurred())
		node, _ := p.NodeName(id)
		nodes = append(nodes, node)
	}
	for _, node := range nodes {
		g.Eventually(func(g Gomega) { renewTime(g, node) }).WithTimeout(wait).Should(Succeed())
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "pods", Name: "p-" + node},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "img"}}},
		}
		_, err := clientset.CoreV1().Pods("pods").Create(ctx, pod, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	for _, node := range nodes {
		g.Eventually(func(g Gomega) corev1.PodPhase {
			pod, err := clientset.CoreV1().Pods("pods").Get(ctx, "p-"+node, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			return pod.Status.Phase
		}).WithTimeout(wait).Should(Equal(corev1.PodRunning))
	}
}

func TestCreateAndRepairRefuseMissingJoinData(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "nojoin", "m", "")
	_, err := p.Create(ctx, m, class, providers.Join{Server: env.Config.Host})
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(providers.ErrNoJoin))
	g.Expect(p.Instances()).To(BeEmpty())

	id, err := p.Create(ctx, m, class, join(t))
	g.Expect(err).NotTo(HaveOccurred())
	err = p.Repair(ctx, id, providers.Operation{ID: "r"})
	g.Expect(providers.IsPermanent(err)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(providers.ErrNoJoin))
	g.Expect(p.Restarts(id)).To(Equal(0))
}

func TestMachinesJoinWithTheirOwnJoinData(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "join", "m", "")
	first := env.JoinData(t)
	id, err := p.Create(ctx, m, class, first)
	g.Expect(err).NotTo(HaveOccurred())
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(nodeFor(g, p, id))).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(certificatesFor(g, first)).To(Equal([]string{"system:node:" + node}), "the machine got its certificate with the join data of Create")

	// A reboot keeps the machine's certificate, as a kubelet keeps its own.
	boot, err := p.BootID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Reboot(ctx, id, providers.Operation{ID: "reboot"})).To(Succeed())
	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, id)
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(boot))
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(certificatesFor(g, first)).To(HaveLen(1), "a reboot asked for a certificate again")

	// A repair wipes it: the machine joins again, with the repair's data.
	second := env.JoinData(t)
	boot, err = p.BootID(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "repair", Join: second})).To(Succeed())
	g.Eventually(func(g Gomega) {
		n := nodeFor(g, p, id)
		g.Expect(n.Status.NodeInfo.BootID).NotTo(Equal(boot))
		g.Expect(readyStatus(n)).To(Equal(corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	g.Expect(certificatesFor(g, second)).To(Equal([]string{"system:node:" + node}), "the repaired machine joined with the repair's join data")
	g.Expect(certificatesFor(g, first)).To(HaveLen(1))
}

func TestAMachineWithATokenTheClusterRefusesRegistersNoNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "badtoken", "m", "")
	// A well-formed token that no Secret backs.
	id, err := p.Create(ctx, m, class, providers.Join{Server: env.Config.Host, CAData: env.Config.CAData, Token: "abcdef.0123456789abcdef"})
	g.Expect(err).NotTo(HaveOccurred())
	node, err := p.NodeName(id)
	g.Expect(err).NotTo(HaveOccurred())
	// The machine has nothing to register its Node with but the token;
	// the wait proves that nothing does for that long.
	g.Consistently(func() bool {
		_, err := clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil
	}).WithTimeout(5 * time.Second).Should(BeFalse())
	// It booted all the same, as a machine does before it joins: its
	// provider knows the boot, which no Node reports.
	g.Expect(p.BootID(id)).NotTo(BeEmpty(), "the machine booted")
}

func TestDescribeTellsWhyAJoinFails(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := newProvider(t)
	m, class := machine(t, "describe-join", "refused", "")
	// A token of the right form that the cluster never stored: refused,
	// as by a cluster without bootstrap-token authentication.
	unknown, err := bootstrap.NewToken()
	g.Expect(err).NotTo(HaveOccurred())
	j := join(t)
	j.Token = unknown.Value()
	id, err := p.Create(ctx, m, class, j)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() *providers.JoinFailure {
		in, err := p.Describe(ctx, id)
		g.Expect(err).NotTo(HaveOccurred())
		return in.JoinFailure
	}, nodeagent.JoinGrace+wait, 100*time.Millisecond).Should(And(
		HaveField("Reason", machinistv1.ReasonBootstrapTokenRefused),
		HaveField("Message", ContainSubstring("--enable-bootstrap-token-auth")),
		HaveField("Message", Not(ContainSubstring(unknown.Secret)))))

	// Repaired with join data that works, it joins, and says nothing more.
	g.Expect(p.Repair(ctx, id, providers.Operation{ID: "op-1", Join: join(t)})).To(Succeed())
	g.Eventually(func() *corev1.Node {
		name, err := p.NodeName(id)
		g.Expect(err).NotTo(HaveOccurred())
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return n
	}, wait, 100*time.Millisecond).ShouldNot(BeNil())
	in, err := p.Describe(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(in.JoinFailure).To(BeNil())
}
