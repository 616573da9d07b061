package testenv

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Version is the Kubernetes version of the fixtures' Machines, the
// control plane's (hack/controlplane).
const Version = "v1.37.2"

// PreviousVersion is the kubelet of the minor before Version's, which
// make node builds beside Version's into kubelets/ (hack/node/kubelet-v1.36):
// a real node made at it can be updated in place to Version.
const PreviousVersion = "v1.36.3"

// Template is a Machine template of class at version, labelled pool=pool.
func Template(pool, class, version string) machinistv1.MachineTemplateSpec {
	return machinistv1.MachineTemplateSpec{
		Metadata: machinistv1.TemplateMetadata{Labels: map[string]string{"pool": pool}},
		Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, Version: version},
	}
}

// MachineSet is a MachineSet of replicas Machines of class small at
// Version, which it labels and selects by pool=name.
func MachineSet(ns, name string, replicas int32) *machinistv1.MachineSet {
	return &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
			Template: Template(name, Small.Name, Version),
		},
	}
}

// MachineDeployment is a MachineDeployment of replicas Machines of class
// small at Version, with the default strategy, which it labels and
// selects by pool=name.
func MachineDeployment(ns, name string, replicas int32) *machinistv1.MachineDeployment {
	return &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
			Template: Template(name, Small.Name, Version),
		},
	}
}

// Budget is a MachineDisruptionBudget over the Machines labelled
// pool=pool: at most max out of service at once, for reasons (all when
// none are given).
func Budget(ns, name, pool string, max int32, reasons ...machinistv1.DisruptionReason) *machinistv1.MachineDisruptionBudget {
	return &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDisruptionBudgetSpec{
			Selector:     machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			MaxDisrupted: intstr.FromInt32(max),
			Reasons:      reasons,
		},
	}
}

// ListMachines lists through c the Machines of ns that match opts, sorted
// by name: as kube-apiserver lists them, and as a cached client need not.
func ListMachines(ctx context.Context, c client.Reader, ns string, opts ...client.ListOption) ([]machinistv1.Machine, error) {
	var list machinistv1.MachineList
	if err := c.List(ctx, &list, append([]client.ListOption{client.InNamespace(ns)}, opts...)...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b machinistv1.Machine) int { return cmp.Compare(a.Name, b.Name) })
	return list.Items, nil
}

// DescribeMachines says, a line each, where the Machines stand: name,
// version, class, phase, a deletion, the operation and remediation in
// progress, and each condition that is not True with its reason and
// message (a Failed Machine's failure among them). It is for failure
// messages; each line begins with a newline and an indent.
func DescribeMachines(ms []machinistv1.Machine) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  %s %s %s %s", m.Name, m.Spec.Version, m.Spec.ClassRef.Name, m.Status.Phase)
		if !m.DeletionTimestamp.IsZero() {
			b.WriteString(" (deleting)")
		}
		if op := m.Status.Operation; op != nil {
			fmt.Fprintf(&b, " op %s %s %s", op.Type, op.ID, op.State)
		}
		if r := m.Status.Remediation; r != nil {
			fmt.Fprintf(&b, " remediation %s %s", r.Action, r.Phase)
		}
		for _, c := range m.Status.Conditions {
			if c.Status != metav1.ConditionTrue {
				fmt.Fprintf(&b, " %s=%s %s: %s;", c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	return b.String()
}

// Machines lists the Machines of ns that match opts, sorted by name, and
// fails t if it cannot.
func (e *Env) Machines(t testing.TB, ns string, opts ...client.ListOption) []machinistv1.Machine {
	t.Helper()
	ms, err := ListMachines(context.Background(), e.Client, ns, opts...)
	if err != nil {
		t.Fatalf("listing the Machines of %s: %v", ns, err)
	}
	return ms
}

// NewMachineList makes an empty MachineList: the newList of Watch for
// Machines.
func NewMachineList() client.ObjectList { return &machinistv1.MachineList{} }

// ReadyMachines creates n Machines labelled pool=name, Running and Ready
// as a Machine controller would have left them, for tests in which none
// runs (budgets and their controller).
func (e *Env) ReadyMachines(t testing.TB, ns, name string, n int) []*machinistv1.Machine {
	t.Helper()
	ctx := context.Background()
	var ms []*machinistv1.Machine
	for i := range n {
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, i), Labels: map[string]string{"pool": name}},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
		}
		if err := e.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		m.Status.Phase = machinistv1.MachineRunning
		m.Status.NodeRef = &machinistv1.NodeReference{Name: m.Name}
		m.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: "NodeReady", LastTransitionTime: metav1.Now()}}
		if err := e.Client.Status().Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	return ms
}

// NewBudget creates a MachineDisruptionBudget over the Machines selector
// matches, changed by change before it is created.
func (e *Env) NewBudget(t testing.TB, ns, name string, selector map[string]string, max intstr.IntOrString, change ...func(*machinistv1.MachineDisruptionBudget)) *machinistv1.MachineDisruptionBudget {
	t.Helper()
	b := &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineDisruptionBudgetSpec{Selector: machinistv1.LabelSelector{MatchLabels: selector}, MaxDisrupted: max},
	}
	for _, c := range change {
		c(b)
	}
	if err := e.Client.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b
}

// DrainRule is a MachineDrainRule in ns with behavior and order, selecting
// the Machines labelled machines (all of them when nil) and the pods of
// the pod selectors (all of them when none).
func DrainRule(ns, name string, behavior machinistv1.DrainBehavior, order *int32, machines map[string]string, pods ...machinistv1.MachineDrainRulePodSelector) *machinistv1.MachineDrainRule {
	r := &machinistv1.MachineDrainRule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineDrainRuleSpec{Behavior: behavior, Order: order, Pods: pods},
	}
	if machines != nil {
		r.Spec.Machines = []machinistv1.MachineDrainRuleMachineSelector{{Selector: machinistv1.LabelSelector{MatchLabels: machines}}}
	}
	return r
}

// PodsLabelled selects the pods labelled l, for DrainRule.
func PodsLabelled(l map[string]string) machinistv1.MachineDrainRulePodSelector {
	return machinistv1.MachineDrainRulePodSelector{Selector: &machinistv1.LabelSelector{MatchLabels: l}}
}

// PodsInNamespacesLabelled selects the pods of the namespaces labelled l,
// for DrainRule.
func PodsInNamespacesLabelled(l map[string]string) machinistv1.MachineDrainRulePodSelector {
	return machinistv1.MachineDrainRulePodSelector{NamespaceSelector: &machinistv1.LabelSelector{MatchLabels: l}}
}

// RegisterCluster hands a cluster to the manager through c, as its
// owner would: kubeconfig in the Secret name-kubeconfig under the
// default key, and the WorkloadCluster name in ns that names it.
func RegisterCluster(ctx context.Context, c client.Client, ns, name string, kubeconfig []byte) (*machinistv1.WorkloadCluster, error) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig"},
		Data:       map[string][]byte{machinistv1.DefaultKubeconfigKey: kubeconfig},
	}
	wc := &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: secret.Name}},
	}
	for _, o := range []client.Object{secret, wc} {
		if err := c.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %T %s/%s: %w", o, ns, o.GetName(), err)
		}
	}
	return wc, nil
}
