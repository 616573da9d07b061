package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
	verbs       *testenv.Verbs
)

const (
	operator = "alice" // bound to machinist-machine-operator
	stranger = "bob"   // bound to nothing
	wait     = 30 * time.Second
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
		env = e
		var err error
		controllers, err = e.StartControllers(manager.Options{
			Backoff:   machinecontroller.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
			DrainPoll: 200 * time.Millisecond,
		}, testenv.Leases{DurationSeconds: 3, RenewInterval: 500 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		stop := func() { _ = controllers.Stop() }
		if verbs, err = e.StartVerbs(); err != nil {
			return stop, err
		}
		stop = func() {
			_ = verbs.Stop()
			_ = controllers.Stop()
		}
		return stop, grantOperator(context.Background())
	}))
}

// grantOperator applies the generated operator ClusterRole and binds it to
// the operator user.
func grantOperator(ctx context.Context) error {
	if out, err := env.Kubectl(ctx, "apply", "-f", filepath.Join(env.Root, "config", "rbac", "operator.yaml")); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "machine-operators"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-machine-operator"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: operator}},
	})
}

// as returns a REST client that kube-apiserver treats as user.
func as(user string) rest.Interface {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	return kubernetes.NewForConfigOrDie(cfg).CoreV1().RESTClient()
}

func verbPath(ns, name, verb string) string {
	return fmt.Sprintf("/apis/%s/namespaces/%s/machines/%s/%s", subresourcesv1.SchemeGroupVersion, ns, name, verb)
}

// put sends a verb through kube-apiserver's aggregated path and returns the
// status code and the body.
func put(ctx context.Context, user, ns, name, verb, body string) (int, string) {
	var code int
	res := as(user).Put().AbsPath(verbPath(ns, name, verb)).SetHeader("Content-Type", "application/json").
		Body([]byte(body)).Do(ctx).StatusCode(&code)
	raw, _ := res.Raw()
	return code, string(raw)
}

func machine(t *testing.T, ctx context.Context, ns, name, class string) *machinistv1.Machine {
	t.Helper()
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func get(g Gomega, ctx context.Context, m *machinistv1.Machine) *machinistv1.Machine {
	out := &machinistv1.Machine{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), out)).To(Succeed())
	return out
}

func running(t *testing.T, ctx context.Context, ns, name, class string) *machinistv1.Machine {
	t.Helper()
	m := machine(t, ctx, ns, name, class)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, ctx, m).Status.Phase).To(Equal(machinistv1.MachineRunning))
	}).WithTimeout(wait).Should(Succeed())
	return get(g, ctx, m)
}

func TestDiscoveryAndOpenAPI(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	out, err := env.Kubectl(ctx, "api-resources", "--api-group", subresourcesv1.GroupName, "-o", "wide")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("machines"))

	res, err := kubernetes.NewForConfigOrDie(env.Config).Discovery().ServerResourcesForGroupVersion(subresourcesv1.SchemeGroupVersion.String())
	g.Expect(err).NotTo(HaveOccurred())
	verbsOf := map[string][]string{}
	for _, r := range res.APIResources {
		verbsOf[r.Name] = r.Verbs
	}
	g.Expect(verbsOf).To(HaveKeyWithValue("machines/reboot", ContainElement("update")))
	g.Expect(verbsOf).To(HaveKeyWithValue("machines/repair", ContainElement("update")))

	// kubectl still resolves a bare "machines" to the CRD.
	_, err = env.Kubectl(ctx, "get", "machines", "-A")
	g.Expect(err).NotTo(HaveOccurred())

	// kube-apiserver aggregates the verbs server's OpenAPI a little after
	// the APIService is Available.
	g.Eventually(func(g Gomega) {
		raw, err := kubernetes.NewForConfigOrDie(env.Config).CoreV1().RESTClient().Get().
			AbsPath("/openapi/v3/apis/" + subresourcesv1.SchemeGroupVersion.String()).DoRaw(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(raw)).To(ContainSubstring(`/machines/{name}/reboot":{"put"`))
		g.Expect(string(raw)).To(ContainSubstring(`/machines/{name}/repair":{"put"`))
		g.Expect(string(raw)).To(ContainSubstring(`"requestedBy"`))
	}).WithTimeout(wait).Should(Succeed())
}

func TestRebootThroughTheAggregator(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: "{}"})
	m := running(t, ctx, ns, "m0", "small")

	code, body := put(ctx, stranger, ns, "m0", "reboot", "")
	g.Expect(code).To(Equal(http.StatusForbidden), body)
	g.Expect(body).To(ContainSubstring(`cannot update resource \"machines/reboot\" in API group \"subresources.machinist.dev\"`))
	g.Expect(get(g, ctx, m).Status.Operation).To(BeNil(), "a refused request leaves nothing behind")

	code, body = put(ctx, operator, ns, "m0", "reboot", `{"apiVersion":"subresources.machinist.dev/v1alpha1","kind":"RebootOptions","mode":"hard"}`)
	g.Expect(code).To(Equal(http.StatusAccepted), body)
	var op subresourcesv1.MachineOperation
	g.Expect(json.Unmarshal([]byte(body), &op)).To(Succeed())
	g.Expect(op.Kind).To(Equal("MachineOperation"))
	g.Expect(op.Type).To(Equal("Reboot"))
	g.Expect(op.ID).To(HavePrefix("reboot-"))
	g.Expect(op.State).To(Equal("Pending"))
	g.Expect(op.Namespace).To(Equal(ns))
	g.Expect(op.RequestedBy).To(Equal(operator))

	g.Eventually(func(g Gomega) {
		got := get(g, ctx, m)
		g.Expect(got.Status.Operation.ID).To(Equal(op.ID))
		g.Expect(got.Status.Operation.State).To(Equal(machinistv1.OperationSucceeded))
		g.Expect(got.Status.Phase).To(Equal(machinistv1.MachineRunning))
		g.Expect(got.Status.BootID).NotTo(Equal(m.Status.BootID))
	}).WithTimeout(wait).Should(Succeed())
	got := get(g, ctx, m)
	g.Expect(got.Status.Operation.RequestedBy).To(Equal(operator))
	g.Expect(got.Status.Operation.Source).To(Equal(machinistv1.SourceAPI))
	g.Expect(got.Status.Operation.Options.Mode).To(Equal(machinistv1.RebootHard))

	// The parent resource answers with the last operation.
	raw, err := as(operator).Get().AbsPath(fmt.Sprintf("/apis/%s/namespaces/%s/machines/m0", subresourcesv1.SchemeGroupVersion, ns)).DoRaw(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(raw)).To(ContainSubstring(`"state":"Succeeded"`))
}

// TestAUserNameLongerThanRequestedByMayBe: Kubernetes bounds no user
// name, the schema bounds requestedBy; the name is cut to fit, and the
// request is taken rather than refused by its own status write.
func TestAUserNameLongerThanRequestedByMayBe(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: "{}"})
	m := running(t, ctx, ns, "m0", "small")
	user := "oidc:https://sso.example.com/" + strings.Repeat("u", machinistv1.MaxRequestedByLength)
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long-named-operator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-machine-operator"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())

	var code int
	var body string
	// RBAC's cache learns of the binding a moment after it is written.
	g.Eventually(func() int {
		code, body = put(ctx, user, ns, "m0", "reboot", "")
		return code
	}).WithTimeout(wait).Should(Equal(http.StatusAccepted), func() string { return body })
	var op subresourcesv1.MachineOperation
	g.Expect(json.Unmarshal([]byte(body), &op)).To(Succeed())
	g.Expect(op.RequestedBy).To(And(HaveLen(machinistv1.MaxRequestedByLength), HavePrefix("oidc:https://sso.example.com/uuu"), HaveSuffix("...")))
	g.Eventually(func(g Gomega) {
		got := get(g, ctx, m)
		g.Expect(got.Status.Operation.ID).To(Equal(op.ID))
		g.Expect(got.Status.Operation.State).To(Equal(machinistv1.OperationSucceeded))
		g.Expect(got.Status.Operation.RequestedBy).To(Equal(op.RequestedBy))
	}).WithTimeout(wait).Should(Succeed())
}

func TestRefusals(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"1m"}`})
	stuckNS := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"neverReady":true}`})
	busy := running(t, ctx, ns, "busy", "small")
	held := running(t, ctx, ns, "held", "small")
	provisioning := machine(t, ctx, stuckNS, "provisioning", "small")
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(get(g, ctx, provisioning).Status.Phase).To(Equal(machinistv1.MachineProvisioning))
	}).WithTimeout(wait).Should(Succeed())

	// A pre-drain hook holds a deleted Machine in Draining.
	g := NewWithT(t)
	patch := client.MergeFrom(held.DeepCopy())
	held.Annotations = map[string]string{machinistv1.PreDrainHookPrefix + "test": ""}
	g.Expect(env.Client.Patch(ctx, held, patch)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, held)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, ctx, held).Status.Phase).To(Equal(machinistv1.MachineDraining))
	}).WithTimeout(wait).Should(Succeed())

	// The first reboot keeps "busy" off for a minute.
	code, body := put(ctx, operator, ns, "busy", "reboot", "{}")
	g.Expect(code).To(Equal(http.StatusAccepted), body)
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, ctx, busy).Status.Phase).To(Equal(machinistv1.MachineRebooting))
	}).WithTimeout(wait).Should(Succeed())

	for _, tc := range []struct {
		name, ns, machine, verb, body string
		code                          int
		says                          string
	}{
		{"provisioning", stuckNS, "provisioning", "reboot", "", http.StatusConflict, "is Provisioning; a reboot can start only when it is Running"},
		{"deleting", ns, "held", "repair", "", http.StatusConflict, "is being deleted"},
		{"second reboot", ns, "busy", "reboot", "", http.StatusConflict, "already has reboot operation"},
		{"repair while rebooting", ns, "busy", "repair", "", http.StatusConflict, "in flight"},
		{"unknown machine", ns, "ghost", "reboot", "", http.StatusNotFound, `machines.machinist.dev "ghost" not found`},
		{"bad mode", ns, "busy", "reboot", `{"mode":"warm"}`, http.StatusUnprocessableEntity, `mode: Unsupported value: "warm": supported values: "soft", "hard"`},
		{"negative grace", ns, "busy", "reboot", `{"gracePeriodSeconds":-1}`, http.StatusUnprocessableEntity, "gracePeriodSeconds: Invalid value: -1: must not be negative"},
		{"unknown field", ns, "busy", "reboot", `{"force":true}`, http.StatusUnprocessableEntity, `json: unknown field "force"`},
		{"wrong type", ns, "busy", "reboot", `{"drain":"yes"}`, http.StatusUnprocessableEntity, "drain: Invalid value"},
		{"wrong kind", ns, "busy", "repair", `{"kind":"RebootOptions"}`, http.StatusUnprocessableEntity, `kind: Unsupported value: "RebootOptions"`},
		{"long reason", ns, "busy", "repair", `{"reason":"` + strings.Repeat("x", 300) + `"}`, http.StatusUnprocessableEntity, "reason: Too long"},
		{"not JSON", ns, "busy", "reboot", `{mode: hard`, http.StatusBadRequest, "is not a JSON RebootOptions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			code, body := put(ctx, operator, tc.ns, tc.machine, tc.verb, tc.body)
			g.Expect(code).To(Equal(tc.code), body)
			var status metav1.Status
			g.Expect(json.Unmarshal([]byte(body), &status)).To(Succeed(), body)
			g.Expect(status.Kind).To(Equal("Status"))
			g.Expect(status.Message).To(ContainSubstring(tc.says))
		})
	}
	g.Expect(get(g, ctx, provisioning).Status.Operation).To(BeNil())
}

func TestForgedIdentityIsRejected(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: "{}"})
	machine(t, ctx, ns, "m0", "small")

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(verbs.Server.CABundle)).To(BeTrue())
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	url := fmt.Sprintf("https://127.0.0.1:%d%s", verbs.Server.Port, verbPath(ns, "m0", "reboot"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader("{}"))
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("X-Remote-User", "system:admin")
	req.Header.Set("X-Remote-Group", "system:masters")
	resp, err := direct.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))

	m := &machinistv1.Machine{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "m0"}, m)).To(Succeed())
	g.Expect(m.Status.Operation).To(BeNil())

	// Health checks need no identity.
	resp, err = direct.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", verbs.Server.Port))
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
}

func TestRebootCompletesOnceAcrossAManagerRestart(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"3s"}`})
	m := running(t, ctx, ns, "m0", "small")

	code, body := put(ctx, operator, ns, "m0", "reboot", `{"drain":false}`)
	g.Expect(code).To(Equal(http.StatusAccepted), body)
	g.Eventually(func(g Gomega) {
		g.Expect(get(g, ctx, m).Status.Phase).To(Equal(machinistv1.MachineRebooting))
	}).WithTimeout(wait).Should(Succeed())

	g.Expect(controllers.RestartManager()).To(Succeed())

	g.Eventually(func(g Gomega) {
		got := get(g, ctx, m)
		g.Expect(got.Status.Operation.State).To(Equal(machinistv1.OperationSucceeded))
		g.Expect(got.Status.Phase).To(Equal(machinistv1.MachineRunning))
	}).WithTimeout(wait).Should(Succeed())
	restarts, err := controllers.Provider.Restarts(m.Status.ProviderID)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(restarts).To(Equal(1), "the restarted manager resumed the reboot, it did not repeat it")
	// Nor does it later.
	g.Consistently(func() (int, error) { return controllers.Provider.Restarts(m.Status.ProviderID) }, "2s").Should(Equal(1))
}
