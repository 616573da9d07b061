package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/admission"
)

// BenchmarkRequestAdmission measures what the admission policies of the
// request annotation cost kube-apiserver: the latency of Machine updates
// without the policies and with them, made one after another by an
// operator (bound to machinist-machine-operator and allowed to patch
// Machines, so that the validating policy really asks the authorizer). Two
// kinds of update: a label change, which every policy must look at and
// let pass, and a request (server dry run, so that nothing reboots), which
// the validating policy checks against RBAC and the mutating one stamps.
func BenchmarkRequestAdmission(b *testing.B) {
	const machines, patches = 100, 2000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := freshEnv(b, testenv.Options{})
	ns := env.NewNamespace(b, "admission")
	operator := operatorClient(ctx, b, e, ns)
	keys := make([]types.NamespacedName, machines)
	for i := range keys {
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("m%d", i)},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "none"}, Version: "v1.37.2"},
		}
		if err := e.Client.Create(ctx, m); err != nil {
			b.Fatal(err)
		}
		keys[i] = client.ObjectKeyFromObject(m)
	}
	request := fmt.Sprintf(`{"metadata":{"annotations":{%q:"reboot"}}}`, machinistv1.RequestAnnotation)
	label := func(i int) string { return fmt.Sprintf(`{"metadata":{"labels":{"turn":"t%d"}}}`, i) }

	// Each patch of a run, one at a time; the median and the mean.
	run := func(b *testing.B, patch func(i int) string, opts ...client.PatchOption) (median, mean time.Duration) {
		took := make([]time.Duration, 0, patches)
		for i := range patches {
			m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: keys[i%machines].Name}}
			start := time.Now()
			if err := operator.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(patch(i))), opts...); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		var sum time.Duration
		for _, d := range took {
			sum += d
		}
		slices.Sort(took)
		return took[len(took)/2], sum / time.Duration(len(took))
	}
	// Without, with, and without again: the two runs without show how
	// much of a difference is only the store growing.
	for _, installed := range []bool{false, true, false} {
		b.Run(fmt.Sprintf("policies=%v", installed), func(b *testing.B) {
			if installed {
				if err := admission.Install(ctx, e.Client); err != nil {
					b.Fatal(err)
				}
			} else {
				uninstall(ctx, b, e)
			}
			awaitPolicies(ctx, b, operator, keys[0], installed)
			// Warm the connection and kube-apiserver's caches first.
			run(b, label)
			b.ResetTimer()
			labelMedian, labelMean := run(b, label)
			requestMedian, requestMean := run(b, func(int) string { return request }, client.DryRunAll)
			b.StopTimer()
			b.ReportMetric(float64(labelMedian.Microseconds()), "µs-label-median")
			b.ReportMetric(float64(labelMean.Microseconds()), "µs-label-mean")
			b.ReportMetric(float64(requestMedian.Microseconds()), "µs-request-median")
			b.ReportMetric(float64(requestMean.Microseconds()), "µs-request-mean")
		})
	}
}

// operatorClient binds a user to machinist-machine-operator and to a Role
// that patches Machines in ns, and returns a client acting as that user.
func operatorClient(ctx context.Context, b *testing.B, e *testenv.Env, ns string) client.Client {
	const user = "bench-operator"
	raw, err := os.ReadFile(filepath.Join(e.Root, "config", "rbac", "operator.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := utilyaml.Unmarshal(raw, role); err != nil {
		b.Fatal(err)
	}
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}
	for _, o := range []client.Object{
		role,
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operator"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   subjects,
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "editor"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{machinistv1.GroupVersion.Group}, Resources: []string{"machines"},
				Verbs: []string{"get", "patch"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "editor"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "editor"},
			Subjects:   subjects,
		},
	} {
		if err := e.Client.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	cfg.QPS, cfg.Burst = qps, burst
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// dryRunRequest asks for value through the request annotation of the
// Machine key, as c, in a server dry run.
func dryRunRequest(ctx context.Context, c client.Client, key types.NamespacedName, value string) (*machinistv1.Machine, error) {
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, machinistv1.RequestAnnotation, value)
	return m, c.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(patch)), client.DryRunAll)
}

// awaitPolicies waits until kube-apiserver runs both policies (a dry-run
// request comes back with the requester's name, and one that names no
// verb is refused), or neither.
func awaitPolicies(ctx context.Context, b *testing.B, c client.Client, key types.NamespacedName, running bool) {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := dryRunRequest(ctx, c, key, "reboot")
		_, refused := dryRunRequest(ctx, c, key, "explode")
		stamped := m.Annotations[machinistv1.RequestedByAnnotation] != ""
		if err == nil && running == stamped && running == apierrors.IsInvalid(refused) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the admission policies are not %s after a minute: %v, %v", map[bool]string{true: "in effect", false: "gone"}[running], err, refused)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// uninstall deletes the policies and their bindings, if there.
func uninstall(ctx context.Context, b *testing.B, e *testenv.Env) {
	objs, err := admission.Objects()
	if err != nil {
		b.Fatal(err)
	}
	for _, u := range objs {
		if err := e.Client.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
			b.Fatal(err)
		}
	}
}
