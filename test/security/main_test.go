// Package security_test tries, as an attacker would, each trust boundary
// docs/security.md lists, against a real kube-apiserver, kube-controller-
// manager, verbs server and manager. The attacker is a tenant: someone who
// may create Machinist's objects and Secrets in one namespace and nothing
// more. The manager runs as its ServiceAccount with the ClusterRole of
// config/rbac narrowed as docs/operations.md says (no Secrets but where
// the Roles of that page grant them), so every test also proves that the
// narrowed manager does its work.
package security_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinecontroller "github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/admission"
	"github.com/machinist-dev/machinist/manager"
)

// The people of these tests and the manager's identity.
const (
	// tenant may create Machinist's objects and Secrets in its namespace
	// (machinist-editor and a Role for Secrets), and nothing more.
	tenant = "tenant"
	// operator is a tenant who is also bound to machinist-machine-operator.
	operator  = "operator"
	managerSA = "system:serviceaccount:machinist-system:machinist-manager"
	class     = "small"
)

var (
	env   *testenv.Env
	ctrls *testenv.Controllers
	verbs *testenv.Verbs
	// metricsPort is where the manager serves /metrics.
	metricsPort int
)

// leases are short, so that an outage shows within seconds.
var leases = testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second}

func TestMain(m *testing.M) {
	// Errors only: a controller's error is worth reading when a test fails.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		env = e
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		stop := func() {
			if verbs != nil {
				_ = verbs.Stop()
			}
			if ctrls != nil {
				_ = ctrls.Stop()
			}
		}
		return stop, setup(ctx)
	}))
}

// setup installs what config/default installs (the ClusterRoles, the
// manager's narrowed as docs/operations.md says, and the admission
// policies), starts the manager as its ServiceAccount and the verbs server.
func setup(ctx context.Context) error {
	narrowed, err := narrowedManagerRole(ctx)
	if err != nil {
		return err
	}
	if err := env.Client.Create(ctx, narrowed); err != nil {
		return err
	}
	if err := env.CreateClusterRoles(ctx, "operator.yaml", "editor.yaml", "metrics_reader.yaml"); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "machinist-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: narrowed.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "machinist-system", Name: "machinist-manager"}},
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		return err
	}
	// The Roles the page grants in kube-system, for the bootstrap tokens
	// of the management cluster's own machines, and in the manager's
	// namespace, for kept ones.
	for _, ns := range []string{"kube-system", testenv.ManagerNamespace} {
		if err := grantSecrets(ctx, ns); err != nil {
			return err
		}
	}
	if err := admission.Install(ctx, env.Client); err != nil {
		return err
	}
	metricsPort, err = freePort()
	if err != nil {
		return err
	}
	ctrls, err = env.StartControllersAs(rest.ImpersonationConfig{
		UserName: managerSA,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:machinist-system", "system:authenticated"},
	}, manager.Options{
		MachineWorkers:          4,
		Backoff:                 machinecontroller.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second},
		DrainPoll:               200 * time.Millisecond,
		OperationTimeout:        time.Minute,
		NodeGrace:               2 * time.Second,
		ClusterProbePeriod:      2 * time.Second,
		ClusterUnreachableAfter: 2 * time.Second,
		MetricsAddr:             fmt.Sprintf("127.0.0.1:%d", metricsPort),
		MetricsSecure:           true,
	}, leases)
	if err != nil {
		return err
	}
	// A provider that adopts whatever exists (instance_test.go).
	if err := ctrls.Register("lax", lax{ctrls.Provider}); err != nil {
		return err
	}
	verbs, err = env.StartVerbs()
	if err != nil {
		return err
	}
	return awaitAdoptPolicy(ctx)
}

// narrowedManagerRole is config/rbac's machinist-manager with the patch
// docs/operations.md gives for taking its Secrets rule out, applied by
// kubectl kustomize as an operator's overlay would apply it.
func narrowedManagerRole(ctx context.Context) (*rbacv1.ClusterRole, error) {
	section, err := secretsSection()
	if err != nil {
		return nil, err
	}
	var patches string
	for _, block := range yamlBlocks(section) {
		if strings.HasPrefix(block, "patches:") {
			patches = block
		}
	}
	if patches == "" {
		return nil, errors.New("docs/operations.md: no kustomize patches block in the section on the manager's Secrets")
	}
	dir, err := os.MkdirTemp("", "machinist-narrowed-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	role, err := os.ReadFile(filepath.Join(env.Root, "config", "rbac", "role.yaml"))
	if err != nil {
		return nil, err
	}
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- role.yaml\n" + patches + "\n"
	for name, data := range map[string][]byte{"role.yaml": role, "kustomization.yaml": []byte(kustomization)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	out, err := env.Kubectl(ctx, "kustomize", dir)
	if err != nil {
		return nil, fmt.Errorf("the narrowing patch of docs/operations.md: %w\n%s", err, out)
	}
	narrowed := &rbacv1.ClusterRole{}
	if err := utilyaml.Unmarshal([]byte(out), narrowed); err != nil {
		return nil, err
	}
	for _, r := range narrowed.Rules {
		for _, res := range r.Resources {
			if res == "secrets" {
				return nil, fmt.Errorf("the narrowed ClusterRole still grants %v on Secrets", r.Verbs)
			}
		}
	}
	return narrowed, nil
}

// secretsSection is the section of docs/operations.md on the manager's
// access to Secrets.
func secretsSection() (string, error) {
	raw, err := os.ReadFile(filepath.Join(env.Root, "docs", "operations.md"))
	if err != nil {
		return "", err
	}
	const heading = "### The manager's access to Secrets"
	_, rest, ok := strings.Cut(string(raw), heading)
	if !ok {
		return "", fmt.Errorf("docs/operations.md has no section %q", heading)
	}
	if i := regexp.MustCompile(`(?m)^##+ `).FindStringIndex(rest); i != nil {
		rest = rest[:i[0]]
	}
	return rest, nil
}

// yamlBlocks are the fenced yaml blocks of a page's text.
func yamlBlocks(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// grantSecrets applies the Roles docs/operations.md grants the manager on
// Secrets in ns: kube-system for bootstrap tokens, the manager's own
// namespace for kept ones, or a namespace of WorkloadClusters with their
// kubeconfig Secrets named. The page's example namespace "fleet" becomes
// ns and its example kubeconfig names become kubeconfigs; each Role is
// bound to the manager's ServiceAccount, as the page says.
func grantSecrets(ctx context.Context, ns string, kubeconfigs ...string) error {
	section, err := secretsSection()
	if err != nil {
		return err
	}
	found := false
	for _, block := range yamlBlocks(section) {
		if !strings.Contains(block, "kind: Role") {
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(block)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("docs/operations.md: %w", err)
			}
			if len(u.Object) == 0 || u.GetKind() != "Role" {
				continue
			}
			if docNamespace(u.GetNamespace()) != docNamespace(ns) {
				continue
			}
			found = true
			role := &rbacv1.Role{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, role); err != nil {
				return err
			}
			role.Namespace = ns
			for i := range role.Rules {
				if len(role.Rules[i].ResourceNames) > 0 {
					role.Rules[i].ResourceNames = kubeconfigs
				}
			}
			binding := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "machinist-system", Name: "machinist-manager"}},
			}
			for _, o := range []client.Object{role, binding} {
				if err := env.Client.Create(ctx, o); err != nil {
					return fmt.Errorf("%s %s/%s from docs/operations.md: %w", o.GetObjectKind().GroupVersionKind().Kind, ns, o.GetName(), err)
				}
			}
		}
	}
	if !found {
		return fmt.Errorf("docs/operations.md grants the manager no Role on Secrets for namespace %s", ns)
	}
	return nil
}

// docNamespace is which of the page's namespaces ns plays: kube-system,
// the manager's own, or any other (the page's "fleet").
func docNamespace(ns string) string {
	switch ns {
	case "kube-system", testenv.ManagerNamespace:
		return ns
	}
	return "fleet"
}

// tenantNamespace makes a namespace for one test, as a platform team
// would give it to a tenant: the MachineClass class, the tenant bound to
// machinist-editor and allowed Secrets there, the operator bound to the
// machine operator role too, and the manager granted what
// docs/operations.md says, with the kubeconfig Secrets named.
func tenantNamespace(t *testing.T, prefix string, kubeconfigs ...string) string {
	t.Helper()
	ctx := context.Background()
	ns := env.NewNamespace(t, prefix, testenv.Class{Name: class})
	objs := []client.Object{
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-secrets"},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{""}, Resources: []string{"secrets"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
			}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-secrets"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant-secrets"},
			Subjects:   []rbacv1.Subject{user(tenant), user(operator)},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "editors"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-editor"},
			Subjects:   []rbacv1.Subject{user(tenant), user(operator)},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operators"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-machine-operator"},
			Subjects:   []rbacv1.Subject{user(operator)},
		},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := grantSecrets(ctx, ns, kubeconfigs...); err != nil {
		t.Fatal(err)
	}
	return ns
}

func user(name string) rbacv1.Subject {
	return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}
}

// as is a client that acts as the named person.
func as(name string) client.Client {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		panic(err)
	}
	return c
}

// freePort is a TCP port of loopback free now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
