package security_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
)

// running creates m and waits until it runs.
func running(t *testing.T, c client.Client, m *machinistv1.Machine) *machinistv1.Machine {
	t.Helper()
	if err := c.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, m.Name+" Running", m, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineRunning || m.Status.NodeRef == nil {
			return fmt.Errorf("phase %s", m.Status.Phase)
		}
		return nil
	})
	return m
}

func machine(ns, name string) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}},
	}
}

// A Machine of another namespace that names a running Machine's instance
// in spec.providerID does not get it, even when made by someone allowed
// to adopt: it fails saying so without naming whose instance it is, and
// deleting it, or asking it to reboot, leaves the instance, its Node and
// its Machine as they were.
func TestAMachineCannotTakeAnotherMachinesInstance(t *testing.T) {
	ctx := context.Background()
	victimNS := tenantNamespace(t, "victim")
	victim := running(t, env.Client, machine(victimNS, "payroll-db"))
	id, node, boot := victim.Status.ProviderID, victim.Status.NodeRef.Name, victim.Status.BootID

	thiefNS := tenantNamespace(t, "thief")
	thief := machine(thiefNS, "thief")
	thief.Spec.ProviderID = id
	// The operator may adopt: what stops this is the instance's owner.
	if err := as(operator).Create(ctx, thief); err != nil {
		t.Fatal(err)
	}
	// Settled either way: refused, or running on what it took.
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the thief settled", thief, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineFailed && m.Status.Phase != machinistv1.MachineRunning {
			return fmt.Errorf("phase %s", m.Status.Phase)
		}
		return nil
	})
	settled := thief.DeepCopy()
	// Whatever the verbs do to the thief, none reaches the instance.
	for _, verb := range []string{"reboot", "repair"} {
		_ = kube(t).CoreV1().RESTClient().Put().
			AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", thiefNS, "machines", thief.Name, verb).
			Body([]byte(`{"drain":false}`)).Do(ctx).Error()
		testenv.WaitForObject(t, env.Client, 30*time.Second, "the thief's "+verb+" over", thief, func(m *machinistv1.Machine) error {
			if op := m.Status.Operation; op != nil && (op.State == machinistv1.OperationPending || op.State == machinistv1.OperationRunning) {
				return fmt.Errorf("operation %+v", op)
			}
			return nil
		})
	}
	if err := env.Client.Delete(ctx, thief); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the thief gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(thief), thief)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	exists, err := ctrls.Provider.Exists(ctx, id)
	if err != nil || !exists {
		t.Errorf("the victim's instance after the thief was deleted: exists %v, %v", exists, err)
	}
	if n, err := kube(t).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Errorf("the victim's Node: %v", err)
	} else if n.Status.NodeInfo.BootID != boot || n.Spec.Unschedulable {
		t.Errorf("the victim's Node: boot ID %s (was %s), unschedulable %v", n.Status.NodeInfo.BootID, boot, n.Spec.Unschedulable)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(victim), victim); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(victim.Status.Conditions, machinistv1.ConditionReady); victim.Status.Phase != machinistv1.MachineRunning ||
		c == nil || c.Status != metav1.ConditionTrue || victim.Status.BootID != boot {
		t.Errorf("the victim: phase %s, Ready %+v, boot ID %s (was %s)", victim.Status.Phase, c, victim.Status.BootID, boot)
	}
	// How the thief was refused.
	reason, message := settled.Status.Failure()
	if settled.Status.Phase != machinistv1.MachineFailed || reason != machinistv1.FailureInstanceTaken {
		t.Errorf("the thief: phase %s, failure %s: %s; want Failed, %s", settled.Status.Phase, reason, message, machinistv1.FailureInstanceTaken)
	}
	if settled.Status.ProviderID != "" || settled.Status.NodeRef != nil {
		t.Errorf("the thief was given the instance: providerID %q, nodeRef %+v", settled.Status.ProviderID, settled.Status.NodeRef)
	}
	for _, secret := range []string{victimNS, victim.Name, string(victim.UID)} {
		if strings.Contains(message, secret) {
			t.Errorf("the thief's failure names the owner's %q: %s", secret, message)
		}
	}
}

// Naming an instance to adopt is a permission of its own: a tenant who
// may create Machines is refused one with spec.providerID, whoever owns
// the instance; an operator, who may adopt, adopts an instance that
// belongs to no Machine, and it runs as that Machine's.
func TestAdoptingNeedsThePermissionToAdopt(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, "adopt")
	id, err := spareInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := machine(ns, "adopter")
	m.Spec.ProviderID = id
	err = as(tenant).Create(ctx, m)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "adopt") {
		t.Fatalf("a tenant creating a Machine that adopts an instance: %v; want Forbidden, naming the verb adopt", err)
	}
	// The same without spec.providerID is the tenant's to create.
	if err := as(tenant).Create(ctx, machine(ns, "plain"), client.DryRunAll); err != nil {
		t.Fatalf("a tenant creating a plain Machine: %v", err)
	}
	m = machine(ns, "adopter")
	m.Spec.ProviderID = id
	running(t, as(operator), m)
	if m.Status.ProviderID != id {
		t.Errorf("the operator's Machine runs on %q, want the instance it adopted, %q", m.Status.ProviderID, id)
	}
	in, err := ctrls.Provider.Describe(ctx, id)
	if err != nil || in.Owner.UID != m.UID {
		t.Errorf("the adopted instance's owner: %+v, %v; want the adopter", in.Owner, err)
	}
}

// kube is an admin clientset of the management cluster.
func kube(t testing.TB) kubernetes.Interface {
	t.Helper()
	k, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var _ = corev1.NodeReady

// lax is a provider that adopts whatever instance exists, as the built-in
// providers did, while its Describe says whose each instance is: whether
// a provider refuses or not, the Machine controller does not hand one
// Machine's instance to another.
type lax struct{ testenv.Provider }

func (p lax) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	if id := m.Spec.ProviderID; id != "" {
		if ok, err := p.Exists(ctx, id); err != nil || !ok {
			return "", providers.Permanent(fmt.Errorf("no instance %s: %v", id, err))
		}
		return id, nil
	}
	return p.Provider.Create(ctx, m, class, join)
}

func TestTheControllerAdoptsNoOtherMachinesInstanceWhateverItsProvider(t *testing.T) {
	ctx := context.Background()
	victimNS := tenantNamespace(t, "lax-victim")
	victim := running(t, env.Client, machine(victimNS, "payroll-db"))
	thiefNS := tenantNamespace(t, "lax-thief")
	laxClass := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: thiefNS, Name: "lax"},
		Spec:       machinistv1.MachineClassSpec{Provider: "lax"},
	}
	if err := env.Client.Create(ctx, laxClass); err != nil {
		t.Fatal(err)
	}
	thief := machine(thiefNS, "thief")
	thief.Spec.ClassRef.Name, thief.Spec.ProviderID = laxClass.Name, victim.Status.ProviderID
	if err := as(operator).Create(ctx, thief); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the thief settled", thief, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineFailed && m.Status.Phase != machinistv1.MachineRunning {
			return fmt.Errorf("phase %s", m.Status.Phase)
		}
		return nil
	})
	if reason, message := thief.Status.Failure(); reason != machinistv1.FailureInstanceTaken || thief.Status.ProviderID != "" {
		t.Errorf("the thief of a provider that adopts anything: phase %s, providerID %q, failure %s: %s; want Failed, %s, no instance",
			thief.Status.Phase, thief.Status.ProviderID, reason, message, machinistv1.FailureInstanceTaken)
	}
}
