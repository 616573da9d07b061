package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/pki"
)

// unit is the floor's work for the i-th Machine in namespace ns: the
// writes the engine needs at least for one Machine.
type unit func(ctx context.Context, c client.Client, ns string, i int) error

// mixed are the resources a full-mix floor writes beyond its units' own:
// what the engine's run writes besides the Machines themselves.
// The joining writes come in the order a machine makes them: its
// bootstrap token, its CertificateSigningRequest, the approver's
// SubjectAccessReview, the approval and signature, the token's removal.
var mixed = []string{"events", "nodes", "nodes/status", "leases",
	"machinesets", "machinesets/status", "machinedeployments", "machinedeployments/status",
	"secrets", "certificatesigningrequests", "subjectaccessreviews",
	"certificatesigningrequests/approval", "certificatesigningrequests/status"}

// joining is a certificate request and a certificate (PEM) for the floor's
// CertificateSigningRequests, made once: the API server checks their
// encoding, not who they name.
var joining = sync.OnceValues(func() (pems [2][]byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pems, err
	}
	if pems[0], err = cert.MakeCSR(key, &pkix.Name{CommonName: "system:node:floor", Organization: []string{"system:nodes"}}, nil, nil); err != nil {
		return pems, err
	}
	ca, err := pki.NewCA("floor")
	if err != nil {
		return pems, err
	}
	pems[1] = ca.CertPEM()
	return pems, nil
})

// prepare makes, before a floor's clock starts, what its units need in
// namespace ns.
type prepare func(ctx context.Context, c client.Client, ns string) error

// mixFloor is the write floor of the engine's whole run: n units, and
// spread over them as many more writes of each resource in mixed as the
// engine's run made (engine) beyond what the units make (own). Events are
// created; a unit's first Node and Lease write creates one, the next ones
// patch it; the sets' writes patch a set made beforehand. All is made
// directly, with the engine's parallelism, and timed. It returns the time
// and the writes it replayed, which match the engine's by resource.
func mixFloor(ctx context.Context, b *testing.B, n int, prepare prepare, work unit, own, engine testenv.Writes) (time.Duration, testenv.Writes) {
	c := floorClient(b)
	ns := env.NewNamespace(b, "mix")
	extra := testenv.Writes{}
	for _, r := range mixed {
		if d := engine[r] - own[r]; d > 0 {
			extra[r] = d
		}
	}
	// Sets to patch, made before the clock starts.
	ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor"},
		Spec: machinistv1.MachineSetSpec{Replicas: ptr.To(int32(0)), Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"floor": "x"}},
			Template: machinistv1.MachineTemplateSpec{Metadata: machinistv1.TemplateMetadata{Labels: map[string]string{"floor": "x"}},
				Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}}}}}
	md := &machinistv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor"},
		Spec: machinistv1.MachineDeploymentSpec{Replicas: ptr.To(int32(0)), Selector: ms.Spec.Selector, Template: ms.Spec.Template}}
	for _, o := range []client.Object{ms, md} {
		if err := c.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	if prepare != nil {
		if err := prepare(ctx, c, ns); err != nil {
			b.Fatal(err)
		}
	}
	// share is how many writes of resource r unit i makes.
	share := func(r string, i int) int {
		total := int(extra[r])
		k := total / n
		if i < total%n {
			k++
		}
		return k
	}
	var replayed sync.Map // resource -> *int64 under mu
	var mu sync.Mutex
	count := func(r string) {
		mu.Lock()
		defer mu.Unlock()
		v, _ := replayed.LoadOrStore(r, new(float64))
		*v.(*float64)++
	}
	patch := func(o client.Object, status bool, body string) error {
		p := client.RawPatch(types.MergePatchType, []byte(body))
		if status {
			return c.Status().Patch(ctx, o, p)
		}
		return c.Patch(ctx, o, p)
	}
	extraWrites := func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", ns, i)},
			Spec: corev1.NodeSpec{ProviderID: "floor:///" + strconv.Itoa(i)}}
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.Name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))}}
		pems, err := joining()
		if err != nil {
			return err
		}
		request, certificate := pems[0], pems[1]
		// A signer of the floor's own, so that kube-controller-manager
		// neither approves nor signs these: the floor makes those writes.
		csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: node.Name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: request, SignerName: "floor.machinist.dev/bench",
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth}}}
		token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.Name}, StringData: map[string]string{"token-secret": "floor"}}
		for r := range slices.Values(mixed) {
			for k := range share(r, i) {
				var err error
				switch r {
				case "events":
					err = c.Create(ctx, &corev1.Event{
						ObjectMeta:     metav1.ObjectMeta{Namespace: ns, GenerateName: "floor-"},
						InvolvedObject: corev1.ObjectReference{APIVersion: machinistv1.GroupVersion.String(), Kind: "Machine", Namespace: ns, Name: fmt.Sprintf("floor-%d", i)},
						Reason:         "Floor", Message: "a write of the floor", Type: corev1.EventTypeNormal,
						Source: corev1.EventSource{Component: "bench"}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
					})
				case "nodes":
					if k == 0 {
						err = c.Create(ctx, node)
					} else {
						err = patch(node, false, fmt.Sprintf(`{"metadata":{"labels":{"floor":"%d"}}}`, k))
					}
				case "nodes/status":
					if node.ResourceVersion == "" {
						continue // no Node in this unit to report on
					}
					err = patch(node, true, fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Floor%d","lastHeartbeatTime":"%s","lastTransitionTime":"%s"}]}}`,
						k, time.Now().UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339)))
				case "leases":
					if k == 0 {
						err = c.Create(ctx, lease)
					} else {
						err = patch(lease, false, fmt.Sprintf(`{"spec":{"renewTime":"%s"}}`, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00")))
					}
				case "secrets":
					if k == 0 {
						err = c.Create(ctx, token)
					} else {
						err = c.Delete(ctx, token)
					}
				case "certificatesigningrequests":
					err = c.Create(ctx, csr)
				case "subjectaccessreviews":
					err = c.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "system:node:floor",
						ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "nodeclient", Verb: "create"}}})
				case "certificatesigningrequests/approval":
					if csr.ResourceVersion == "" {
						continue
					}
					csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
						Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Floor", Message: "a write of the floor"})
					err = c.SubResource("approval").Update(ctx, csr)
				case "certificatesigningrequests/status":
					if len(csr.Status.Conditions) == 0 {
						continue
					}
					csr.Status.Certificate = certificate
					err = c.Status().Update(ctx, csr)
				case "machinesets", "machinedeployments":
					var o client.Object = ms
					if r == "machinedeployments" {
						o = md
					}
					err = patch(o.DeepCopyObject().(client.Object), false, fmt.Sprintf(`{"metadata":{"annotations":{"floor":"%d-%d"}}}`, i, k))
				case "machinesets/status", "machinedeployments/status":
					var o client.Object = ms
					if r == "machinedeployments/status" {
						o = md
					}
					err = patch(o.DeepCopyObject().(client.Object), true, fmt.Sprintf(`{"status":{"observedGeneration":%d}}`, i*10+k))
				}
				if err != nil {
					return fmt.Errorf("%s write %d of unit %d: %w", r, k, i, err)
				}
				count(r)
			}
		}
		return nil
	}
	took := runUnits(ctx, b, c, ns, n, func(ctx context.Context, c client.Client, ns string, i int) error {
		if err := work(ctx, c, ns, i); err != nil {
			return err
		}
		return extraWrites(i)
	})
	out := testenv.Writes{}
	replayed.Range(func(k, v any) bool { out[k.(string)] = *v.(*float64); return true })
	for r, v := range own {
		out[r] += v
	}
	return took, out
}

// floorClient is a client with the engine's rate limits.
func floorClient(b *testing.B) client.Client {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = qps, burst
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// runUnits runs work for units 0 to n-1 with the engine's parallelism and
// times it.
func runUnits(ctx context.Context, b *testing.B, c client.Client, ns string, n int, work unit) time.Duration {
	jobs := make(chan int)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				if err := work(ctx, c, ns, i); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	took := time.Since(start)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return took
}

// createUnit is the scale-up's unit: a Machine created (finalizer on) and
// its status written twice, Provisioning then Running.
func createUnit(ctx context.Context, c client.Client, ns string, i int) error {
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "floor-",
			Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
	}
	if err := c.Create(ctx, m); err != nil {
		return err
	}
	for _, p := range []machinistv1.MachinePhase{machinistv1.MachineProvisioning, machinistv1.MachineRunning} {
		m.Status.Phase = p
		m.Status.ProviderID = "floor:///" + strconv.Itoa(i)
		if err := c.Status().Update(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// createWrites are a scale-up unit's writes for n Machines.
func createWrites(n int) testenv.Writes {
	return testenv.Writes{"machines": float64(n), "machines/status": 2 * float64(n)}
}
