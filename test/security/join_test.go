package security_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes"
)

// ownCluster starts a workload cluster for one test and hands it, as the
// tenant, to the manager as WorkloadCluster name in ns (whose namespace
// Roles must name name+"-kubeconfig").
func ownCluster(t *testing.T, ns, name string) (*testenv.Env, *machinistv1.WorkloadCluster) {
	t.Helper()
	w, err := testenv.StartWith(testenv.Options{Workload: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test's machines go before their cluster does: their agents
		// would otherwise knock at its door for the rest of the run.
		ctx := context.Background()
		if ms, err := testenv.ListMachines(ctx, env.Client, ns); err == nil {
			for _, m := range ms {
				if m.Status.ProviderID != "" {
					_ = ctrls.Provider.Delete(ctx, m.Status.ProviderID)
				}
			}
		}
		_ = w.Stop()
	})
	kubeconfig, err := os.ReadFile(w.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := testenv.RegisterCluster(context.Background(), as(tenant), ns, name, kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return w, wc
}

// forgeKeptToken makes, as c, the Secret the manager would keep a
// repaired machine's token in, in namespace ns, with every mark the
// manager puts on its own (name, label, annotation, type, the token ID
// derived from m's UID) and an owner reference to m, but a token of the
// forger's choosing. It returns the token's secret half.
func forgeKeptToken(t *testing.T, c client.Client, ns string, m *machinistv1.Machine) string {
	t.Helper()
	secret := rand.String(16)
	token := nodes.PublishedTokenID(m.UID) + "." + secret
	forged := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "machinist-join-" + string(m.UID),
			Labels:      map[string]string{nodes.TokenMachineLabel: string(m.UID)},
			Annotations: map[string]string{"machinist.dev/kept-for": m.Namespace + "/" + m.Name},
		},
		Type: nodes.KeptTokenSecretType,
		Data: map[string][]byte{"token": []byte(token)},
	}
	if ns == m.Namespace {
		forged.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: machinistv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID, Controller: ptr.To(true),
		}}
	}
	if err := c.Create(context.Background(), forged); err != nil {
		t.Fatal(err)
	}
	return secret
}

// managerMayUseSecrets grants the manager what config/default's
// ClusterRole grants it on Secrets, in ns alone.
func managerMayUseSecrets(t *testing.T, ns string) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manager-secrets"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "get", "delete"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manager-secrets"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "machinist-system", Name: "machinist-manager"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// published fails t if the cluster holds a bootstrap token whose secret
// half is secret.
func published(ctx context.Context, k kubernetes.Interface, secret string) error {
	list, err := k.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil // the cluster is down: nothing can be published
	}
	for _, s := range list.Items {
		if string(s.Data["token-secret"]) == secret {
			return fmt.Errorf("the tenant's token is a bootstrap token of the cluster: Secret %s", s.Name)
		}
	}
	return nil
}

// watchTokens checks the cluster for the forged token every half second
// until ctx ends, and reports the first sighting.
func watchTokens(ctx context.Context, k kubernetes.Interface, secret string) <-chan error {
	seen := make(chan error, 1)
	go func() {
		defer close(seen)
		for ctx.Err() == nil {
			if err := published(ctx, k, secret); err != nil {
				seen <- err
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	return seen
}

// unseen waits until m's Node side is unknown, its cluster down.
func unseen(t *testing.T, m *machinistv1.Machine) {
	t.Helper()
	testenv.WaitForObject(t, env.Client, time.Minute, m.Name+"'s Node side unknown", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != machinistv1.ReasonClusterUnreachable {
			return fmt.Errorf("NodeHealthy %+v", c)
		}
		return nil
	})
}

// A Secret named as the manager names the token it keeps for a Machine
// is not the manager's because of its name: one a tenant made in the
// Machine's namespace, marked in every way the manager marks its own, is
// never published in the Machine's cluster when that cluster comes back;
// and the tenant may not make one where the manager keeps its own.
func TestAHandMadeKeptTokenIsNotPublished(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := tenantNamespace(t, "kept", "far-kubeconfig")
	// As config/default's ClusterRole, not narrowed, lets it: that the
	// manager may read the tenant's Secrets must not make their Secret the
	// manager's token.
	managerMayUseSecrets(t, ns)
	w, wc := ownCluster(t, ns, "far")
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := machine(ns, "far")
	m.Spec.ClusterName = wc.Name
	running(t, env.Client, m)
	secret := forgeKeptToken(t, as(tenant), ns, m)
	seen := watchTokens(ctx, wkube, secret)
	elsewhere := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testenv.ManagerNamespace, Name: "machinist-join-" + string(m.UID)}}
	if err := as(tenant).Create(ctx, elsewhere); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant creating a Secret in the manager's namespace: %v; want Forbidden", err)
	}

	if err := w.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	unseen(t, m)
	if err := w.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, m.Name+"'s Node healthy again", m, func(m *machinistv1.Machine) error {
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("NodeHealthy %+v", c)
		}
		return nil
	})
	// Long enough for the manager to have published a kept token: it does
	// at its first look once the cluster answers.
	time.Sleep(5 * time.Second)
	cancel()
	if err := <-seen; err != nil {
		t.Error(err)
	}
}

// A Machine repaired while its cluster is down is given a token the
// manager made, even where a Secret it did not make sits under the kept
// token's name in its own namespace (made by someone who may write there,
// or left from a create whose record was lost): the manager says so in a
// Warning Event, the machine joins with the manager's token once the
// cluster is back, and the other token is never the cluster's. The manager
// runs with the Secret access docs/operations.md narrows it to.
func TestARepairDuringAnOutageUsesOnlyTheManagersToken(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := tenantNamespace(t, "mend", "far-kubeconfig")
	w, wc := ownCluster(t, ns, "far")
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := machine(ns, "mend")
	m.Spec.ClusterName = wc.Name
	running(t, env.Client, m)
	before := m.Status.BootID

	if err := w.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	unseen(t, m)
	secret := forgeKeptToken(t, env.Client, testenv.ManagerNamespace, m)
	seen := watchTokens(ctx, wkube, secret)
	err = kube(t).CoreV1().RESTClient().Put().
		AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, "repair").
		Body([]byte(`{"drain":false,"reason":"its cluster is down"}`)).Do(ctx).Error()
	if err != nil {
		t.Fatal(err)
	}
	var providerBoot string
	testenv.WaitForObject(t, env.Client, time.Minute, "repaired on its provider's word", m, func(m *machinistv1.Machine) error {
		op := m.Status.Operation
		if op == nil || op.Type != machinistv1.OperationRepair || op.State != machinistv1.OperationSucceeded || op.ProviderBootID == "" || op.ProviderBootID == before {
			return fmt.Errorf("phase %s, operation %+v, Ready %+v", m.Status.Phase, op, meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady))
		}
		providerBoot = op.ProviderBootID
		return nil
	})
	// Said, not only done: the Event names the Secret not used.
	if err := testenv.Poll(30*time.Second, func() error {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == m.Name && e.Type == corev1.EventTypeWarning && e.Reason == "KeptTokenRefused" {
				return nil
			}
		}
		return fmt.Errorf("none among %d Events", len(events.Items))
	}); err != nil {
		t.Errorf("a Warning Event about the Secret the manager did not make: %v", err)
	}

	if err := w.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the repaired machine joined again", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if c == nil || c.Status != metav1.ConditionTrue || m.Status.BootID != providerBoot {
			return fmt.Errorf("NodeHealthy %+v, boot ID %s (the provider's %s)", c, m.Status.BootID, providerBoot)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	cancel()
	if err := <-seen; err != nil {
		t.Error(err)
	}
	// Nothing left of the kept token in the management cluster.
	var s corev1.Secret
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: testenv.ManagerNamespace, Name: "machinist-join-" + string(m.UID)}, &s); err == nil {
		t.Errorf("Secret %s is still there (made by %v)", s.Name, s.ManagedFields)
	}
}
