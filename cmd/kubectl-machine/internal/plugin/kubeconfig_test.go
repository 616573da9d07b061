package plugin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestKubeconfig reads WorkloadClusters' kubeconfigs through the real
// kubectl and kube-apiserver, whose RBAC decides who may: the kubeconfig
// stored is the test control plane's own, so the one printed must reach it.
func TestKubeconfig(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "kubectl-machine")
	admin, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := env.Client.Create(ctx, o); err != nil {
				t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
			}
		}
	}
	secret := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
	}
	cluster := func(name, secretName, key string) *machinistv1.WorkloadCluster {
		return &machinistv1.WorkloadCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: secretName, Key: key}},
		}
	}
	create(
		// As Cluster API writes it: <cluster>-kubeconfig, key value.
		secret("prod-kubeconfig", map[string][]byte{"value": admin}),
		cluster("prod", "prod-kubeconfig", ""),
		secret("edge-admin", map[string][]byte{"admin.conf": admin, "value": []byte("not this one")}),
		cluster("edge", "edge-admin", "admin.conf"),
		cluster("orphan", "orphan-kubeconfig", ""),
		secret("wrongkey-kubeconfig", map[string][]byte{"kubeconfig": admin, "ca.crt": []byte("x")}),
		cluster("wrongkey", "wrongkey-kubeconfig", ""),
		secret("blank-kubeconfig", map[string][]byte{"value": {}}),
		cluster("blank", "blank-kubeconfig", ""),
	)

	t.Run("prints the kubeconfig from the Secret and key the WorkloadCluster names", func(t *testing.T) {
		r := kubectl(t, ns, "kubeconfig", "prod")
		if r.code != ExitOK || r.stdout != string(admin) || r.stderr != "" {
			t.Fatalf("want exit code 0 and the Secret's kubeconfig, as stored, alone on stdout:\n%s", r)
		}
		// The printed kubeconfig is one kubectl can use as it is.
		file := filepath.Join(t.TempDir(), "prod.kubeconfig")
		if err := os.WriteFile(file, []byte(r.stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(testenv.BinDir(), "kubectl"), "--kubeconfig", file, "get", "namespace", ns, "-o", "name").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "namespace/"+ns {
			t.Errorf("kubectl with the printed kubeconfig: %v\n%s", err, out)
		}

		for _, args := range [][]string{{"kubeconfig", "wc/edge"}, {"kubeconfig", "workloadclusters.machinist.dev", "edge"}} {
			if r := plugin(ns, args...); r.code != ExitOK || r.stdout != string(admin) {
				t.Errorf("%v: want the kubeconfig under the key admin.conf:\n%s", args, r)
			}
		}
	})

	t.Run("a missing WorkloadCluster, Secret or key, or an empty key, is refused", func(t *testing.T) {
		for _, tc := range []struct{ cluster, want string }{
			{"nope", fmt.Sprintf(`workloadcluster "nope" not found in namespace %q`, ns)},
			{"orphan", fmt.Sprintf(`workloadcluster "orphan" names Secret "orphan-kubeconfig" in namespace %q for its kubeconfig, and there is no such Secret`, ns)},
			{"wrongkey", fmt.Sprintf(`there is no key "value" in Secret "wrongkey-kubeconfig" in namespace %q, where workloadcluster "wrongkey" reads its kubeconfig; its keys are: "ca.crt", "kubeconfig"`, ns)},
			{"blank", fmt.Sprintf(`the key "value" of Secret "blank-kubeconfig" in namespace %q, where workloadcluster "blank" reads its kubeconfig, is empty`, ns)},
		} {
			r := kubectl(t, ns, "kubeconfig", tc.cluster)
			if want := "error: " + tc.want + "\n"; r.code != ExitRefused || r.stderr != want || r.stdout != "" {
				t.Errorf("want exit code %d, nothing on stdout and stderr %q:\n%s", ExitRefused, want, r)
			}
		}
	})

	t.Run("RBAC on the Secret decides who reads it", func(t *testing.T) {
		const reader = "cluster-reader"
		create(
			&rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workloadcluster-reader"},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{machinistv1.GroupVersion.Group}, Resources: []string{"workloadclusters"}, Verbs: []string{"get", "list", "watch"}}},
			},
			binding(ns, "workloadcluster-reader", reader),
		)
		waitAllowed(t, reader, ns, machinistv1.GroupVersion.Group, "workloadclusters", "prod")

		r := plugin(ns, "kubeconfig", "prod", "--as", reader)
		want := fmt.Sprintf(`error: not allowed to read Secret "prod-kubeconfig" in namespace %[1]q, which holds the kubeconfig of workloadcluster "prod": `+
			`this needs get on secrets in that namespace (a Role may grant it for this Secret alone, with resourceNames: [prod-kubeconfig]): `+
			`secrets "prod-kubeconfig" is forbidden: User %[2]q cannot get resource "secrets" in API group "" in the namespace %[1]q`+"\n", ns, reader)
		if r.code != ExitRefused || r.stderr != want || r.stdout != "" {
			t.Errorf("want exit code %d, nothing on stdout and stderr %q:\n%s", ExitRefused, want, r)
		}

		r = plugin(ns, "kubeconfig", "prod", "--as", "nobody")
		want = fmt.Sprintf(`error: not allowed to get workloadcluster "prod" in namespace %[1]q: `+
			`workloadclusters.machinist.dev "prod" is forbidden: User "nobody" cannot get resource "workloadclusters" in API group "machinist.dev" in the namespace %[1]q`+"\n", ns)
		if r.code != ExitRefused || r.stderr != want {
			t.Errorf("want exit code %d and stderr %q:\n%s", ExitRefused, want, r)
		}

		// The narrowing the error suggests is enough, and no wider.
		create(
			&rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prod-kubeconfig-reader"},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"prod-kubeconfig"}, Verbs: []string{"get"}}},
			},
			binding(ns, "prod-kubeconfig-reader", reader),
		)
		waitAllowed(t, reader, ns, "", "secrets", "prod-kubeconfig")
		if r := plugin(ns, "kubeconfig", "prod", "--as", reader); r.code != ExitOK || r.stdout != string(admin) {
			t.Errorf("with get on the Secret, want the kubeconfig:\n%s", r)
		}
		if r := plugin(ns, "kubeconfig", "edge", "--as", reader); r.code != ExitRefused || !strings.HasPrefix(r.stderr, `error: not allowed to read Secret "edge-admin" `) {
			t.Errorf("get on prod's Secret alone must not read edge's:\n%s", r)
		}
	})

	t.Run("bad arguments are usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"kubeconfig"},
			{"kubeconfig", "md/prod"},
			{"kubeconfig", "fleet/prod/x"},
			{"kubeconfig", "prod", "edge", "more"},
		} {
			if r := plugin(ns, args...); r.code != ExitError || !strings.HasPrefix(r.stderr, "error: ") || r.stdout != "" {
				t.Errorf("%v should be a usage error (exit code %d):\n%s", args, ExitError, r)
			}
		}
	})
}

// binding binds the Role of that name in ns to user.
func binding(ns, role, user string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role + "-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
}

// waitAllowed waits until the authorizer lets user get the object: RBAC
// reads Roles through a cache, so a Role just made may not count yet.
func waitAllowed(t *testing.T, user, ns, group, resource, name string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%s allowed to get %s %s", user, resource, name), func() error {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "get", Group: group, Resource: resource, Name: name,
			},
		}}
		if err := env.Client.Create(context.Background(), review); err != nil {
			return err
		}
		if !review.Status.Allowed {
			return fmt.Errorf("not allowed: %s", review.Status.Reason)
		}
		return nil
	})
}
