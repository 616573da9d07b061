package failure

import (
	"context"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// refuseLabel marks the Machines whose status may not record a providerID.
const refuseLabel = "failure.machinist.dev/refuse-provider-id"

// refuseProviderIDs makes kube-apiserver itself refuse, in namespace ns,
// every status write that records a providerID on a Machine labelled
// refuseLabel: a real failed write, from a real admission policy, between
// the provider's Create and the record of what it made.
func refuseProviderIDs(t *testing.T, c client.Client, ns string) {
	t.Helper()
	refuse(t, c, ns, "refuse-provider-id", "machines/status",
		`!has(object.status.providerID)`,
		func(p *machinistv1.Machine) { p.Status.ProviderID = "inmemory:///" + ns + "/probe/0" },
		func(p *machinistv1.Machine) error {
			return c.Status().Update(context.Background(), p, client.DryRunAll)
		})
}

// refuse installs a ValidatingAdmissionPolicy, bound to namespace ns, that
// refuses UPDATEs of resource (machines or machines/status) to Machines
// labelled refuseLabel unless allowed (a CEL expression over object and
// oldObject) holds, and removes it when the test ends. It returns once the
// policy is in force: policies take effect a moment after they are stored,
// so a probe Machine is changed by change and written by write (a dry run)
// until that is refused.
func refuse(t *testing.T, c client.Client, ns, name, resource, allowed string,
	change func(*machinistv1.Machine), write func(*machinistv1.Machine) error) func() {
	t.Helper()
	ctx := context.Background()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + ns},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{"machinist.dev"}, APIVersions: []string{"v1alpha1"},
						Resources: []string{resource}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: `!has(object.metadata.labels) || !('` + refuseLabel + `' in object.metadata.labels) || (` + allowed + `)`,
				Message:    "refused by the test (" + name + ")",
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns},
			}},
		},
	}
	remove := func() {
		for _, o := range []client.Object{binding, policy} {
			_ = c.Delete(context.Background(), o)
		}
	}
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(remove)
	probe := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-probe", Labels: map[string]string{refuseLabel: "yes"}},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "no-such-class"}},
	}
	if err := c.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the admission policy in force", func() bool {
		p := &machinistv1.Machine{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(probe), p); err != nil {
			t.Fatal(err)
		}
		change(p)
		err := write(p)
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err)
	})
	if err := c.Delete(ctx, probe); err != nil {
		t.Fatal(err)
	}
	return remove
}

// Create succeeds, the status write that records the providerID fails, and
// the Machine is deleted while still Pending: the controller finds the
// instance by the Machine's UID and deletes it, and its Node.
func TestNoInstanceLeaksWhenItsProviderIDWasNeverStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := env.Client
	ns := env.NewNamespace(t, "leak")
	class(t, c, ns, "small", "inmemory", "")
	refuseProviderIDs(t, c, ns)

	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaky", Labels: map[string]string{refuseLabel: "yes"},
			Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
	}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var id string
	testenv.WaitFor(t, 30*time.Second, "the provider's instance", func() bool {
		var err error
		id, err = controllers.Provider.FindByUID(ctx, m.UID)
		if err != nil {
			t.Fatal(err)
		}
		return id != ""
	})
	nodeOf := func() []corev1.Node {
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
			t.Fatal(err)
		}
		var out []corev1.Node
		for _, n := range nodes.Items {
			if n.Spec.ProviderID == id {
				out = append(out, n)
			}
		}
		return out
	}
	testenv.WaitFor(t, 30*time.Second, "the instance's Node", func() bool { return len(nodeOf()) == 1 })
	if got := get(t, c, m); got.Status.ProviderID != "" || got.Status.Phase == machinistv1.MachineProvisioning {
		t.Fatalf("the status write was not refused: phase %s, providerID %q", got.Status.Phase, got.Status.ProviderID)
	}

	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the Machine gone", func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
	})
	if left, err := controllers.Provider.FindByUID(ctx, m.UID); err != nil || left != "" {
		t.Fatalf("instance %q outlived its Machine (err %v)", left, err)
	}
	if exists, err := controllers.Provider.Exists(ctx, id); err != nil || exists {
		t.Fatalf("instance %s exists: %v (err %v)", id, exists, err)
	}
	if nodes := nodeOf(); len(nodes) != 0 {
		t.Fatalf("Node %s outlived its Machine", nodes[0].Name)
	}
}

// A finalizer removal that fails (here refused; in life, a conflict)
// leaves the Machine Deleting, never stored as Deleted, from which no move
// leads: once the removal is allowed, the Machine goes.
func TestAFailedFinalizerRemovalLeavesTheMachineDeleting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := env.Client
	ns := env.NewNamespace(t, "finalizer")
	class(t, c, ns, "small", "inmemory", "")
	allow := refuse(t, c, ns, "keep-finalizer", "machines",
		`!has(oldObject.metadata.finalizers) || !('`+machinistv1.MachineFinalizer+`' in oldObject.metadata.finalizers) || `+
			`(has(object.metadata.finalizers) && '`+machinistv1.MachineFinalizer+`' in object.metadata.finalizers)`,
		func(p *machinistv1.Machine) { p.Finalizers = nil },
		func(p *machinistv1.Machine) error { return c.Update(context.Background(), p, client.DryRunAll) })

	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept", Labels: map[string]string{refuseLabel: "yes"},
			Finalizers: []string{machinistv1.MachineFinalizer}},
		Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
	}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "Running", func() bool { return get(t, c, m).Status.Phase == machinistv1.MachineRunning })
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the instance deleted", func() bool {
		id, err := controllers.Provider.FindByUID(ctx, m.UID)
		return err == nil && id == ""
	})
	// Several refused removals later, the Machine is still Deleting:
	// nothing is to happen in these three seconds.
	time.Sleep(3 * time.Second)
	if got := get(t, c, m); got.Status.Phase != machinistv1.MachineDeleting {
		t.Fatalf("phase %q after a refused finalizer removal; want Deleting", got.Status.Phase)
	}
	allow()
	testenv.WaitFor(t, 30*time.Second, "the Machine gone once its finalizer may go", func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
	})
}
