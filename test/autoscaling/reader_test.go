package autoscaling

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// group is what the autoscaler is given as CAPI_GROUP.
const group = "machinist.dev"

// The keys the autoscaler builds from CAPI_GROUP.
const (
	minSizeKey       = group + "/cluster-api-autoscaler-node-group-min-size"
	maxSizeKey       = group + "/cluster-api-autoscaler-node-group-max-size"
	deleteMachineKey = group + "/delete-machine"
	machineKey       = group + "/machine"
	namespaceKey     = group + "/cluster-namespace"
)

// reader reads and writes Machinist's objects as the cluster-autoscaler's
// clusterapi provider does: unstructured, at the group's preferred
// version, found by discovery.
type reader struct {
	t       *testing.T
	version string
	dyn     dynamic.Interface
	kube    kubernetes.Interface
}

func newReader(t *testing.T) *reader {
	t.Helper()
	disc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := disc.ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	r := &reader{t: t}
	for _, g := range groups.Groups {
		if g.Name == group {
			r.version = g.PreferredVersion.Version
		}
	}
	if r.version == "" {
		t.Fatalf("discovery has no API group %s: the autoscaler exits", group)
	}
	// It looks for these by name in the preferred version; machines and
	// machinesets it takes for granted, and would wait for forever.
	resources, err := disc.ServerResourcesForGroupVersion(group + "/" + r.version)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, res := range resources.APIResources {
		names = append(names, res.Name)
	}
	for _, want := range []string{"machines", "machinesets", "machinedeployments", "machinesets/scale", "machinedeployments/scale"} {
		if !slices.Contains(names, want) {
			t.Fatalf("%s/%s serves %v, not %s", group, r.version, names, want)
		}
	}
	if r.dyn, err = dynamic.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if r.kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *reader) resource(plural string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: group, Version: r.version, Resource: plural}
}

func (r *reader) get(plural, ns, name string) (*unstructured.Unstructured, error) {
	return r.dyn.Resource(r.resource(plural)).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
}

// ownerOfKind is the first owner reference of the kind with a name: the
// provider looks at neither its group nor whether it is the controller.
func ownerOfKind(u *unstructured.Unstructured, kind string) string {
	for _, ref := range u.GetOwnerReferences() {
		if ref.Kind == kind && ref.Name != "" {
			return ref.Name
		}
	}
	return ""
}

// groupForNode is the node group of node: its Machine, found by the
// provider's index of spec.providerID or else by the Node's annotations
// naming it, then that Machine's MachineSet by owner reference, then the
// set's MachineDeployment if it has one. It returns the group's kind and
// name.
func (r *reader) groupForNode(node *corev1.Node) (kind, name string, err error) {
	if node.Spec.ProviderID == "" {
		return "", "", fmt.Errorf("node %s has no providerID: it belongs to no node group", node.Name)
	}
	m, err := r.machineForNode(node)
	if err != nil {
		return "", "", err
	}
	setName := ownerOfKind(m, "MachineSet")
	if setName == "" {
		return "", "", fmt.Errorf("machine %s has no MachineSet owner", m.GetName())
	}
	ms, err := r.get("machinesets", m.GetNamespace(), setName)
	if err != nil {
		return "", "", err
	}
	if mdName := ownerOfKind(ms, "MachineDeployment"); mdName != "" {
		md, err := r.get("machinedeployments", ms.GetNamespace(), mdName)
		if err != nil {
			return "", "", err
		}
		return "MachineDeployment", md.GetName(), nil
	}
	return "MachineSet", ms.GetName(), nil
}

// machineForNode finds the Machine of a Node as the provider does.
func (r *reader) machineForNode(node *corev1.Node) (*unstructured.Unstructured, error) {
	list, err := r.dyn.Resource(r.resource("machines")).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	want := normalized(node.Spec.ProviderID)
	var byID []unstructured.Unstructured
	for _, m := range list.Items {
		if id, _, _ := unstructured.NestedString(m.Object, "spec", "providerID"); id != "" && normalized(id) == want {
			byID = append(byID, m)
		}
	}
	switch len(byID) {
	case 1:
		return &byID[0], nil
	case 0:
	default:
		return nil, fmt.Errorf("internal error; expected len==1, got %d Machines for %s", len(byID), want)
	}
	key := path.Join(node.Annotations[namespaceKey], node.Annotations[machineKey])
	ns, name := path.Split(key)
	if ns == "" || name == "" {
		return nil, fmt.Errorf("machine not found for node %s: no Machine has its providerID and its annotations name none (%q)", node.Name, key)
	}
	return r.get("machines", path.Clean(ns), name)
}

// normalized is what the provider compares of a providerID: what follows
// its last "/".
func normalized(id string) string { return path.Base(id) }

// instance is one of a node group's instances as the provider reports
// it to the autoscaler.
type instance struct {
	id    string
	state string // running, creating or deleting
	// failed says the provider reports a provisioning error for it, which
	// makes the autoscaler back the group off.
	failed bool
}

// instances are the instances of the node group (a MachineDeployment or
// MachineSet, by plural): its Machines, chosen by its spec.selector in
// its namespace, each failed (status.failureMessage present), deleting,
// pending (no status.nodeRef) or running under the providerID of its
// spec or, lacking one, of the Node its nodeRef names.
func (r *reader) instances(plural, ns, name string) []instance {
	r.t.Helper()
	ctx := context.Background()
	g, err := r.get(plural, ns, name)
	if err != nil {
		r.t.Fatal(err)
	}
	sel, ok, err := unstructured.NestedMap(g.Object, "spec", "selector")
	if err != nil || !ok {
		r.t.Fatalf("%s %s: expected field spec.selector on scalable resource type (%v)", plural, name, err)
	}
	var ls metav1.LabelSelector
	if err := runtimeFromUnstructured(sel, &ls); err != nil {
		r.t.Fatal(err)
	}
	selector, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		r.t.Fatal(err)
	}
	list, err := r.dyn.Resource(r.resource("machines")).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []instance
	for _, m := range list.Items {
		fake := m.GetNamespace() + "_" + m.GetName()
		_, failed, err := unstructured.NestedString(m.Object, "status", "failureMessage")
		if err != nil {
			r.t.Fatalf("Machine %s: status.failureMessage: %v", m.GetName(), err)
		}
		_, hasNode, _ := unstructured.NestedMap(m.Object, "status", "nodeRef")
		switch {
		case failed && !m.GetDeletionTimestamp().IsZero():
			out = append(out, instance{id: "failed-machine-" + fake, state: "deleting", failed: true})
		case failed && !hasNode:
			out = append(out, instance{id: "failed-machine-" + fake, state: "creating", failed: true})
		case failed:
			// No status: taken for an instance that never registered.
			out = append(out, instance{id: "failed-machine-" + fake, failed: true})
		case !m.GetDeletionTimestamp().IsZero():
			out = append(out, instance{id: "deleting-machine-" + fake, state: "deleting"})
		case !hasNode:
			out = append(out, instance{id: "pending-machine-" + fake, state: "creating"})
		default:
			id, _, _ := unstructured.NestedString(m.Object, "spec", "providerID")
			if id == "" {
				nodeName, _, _ := unstructured.NestedString(m.Object, "status", "nodeRef", "name")
				node, err := r.kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					continue // silently left out, as the provider does
				}
				id = node.Spec.ProviderID
			}
			out = append(out, instance{id: id, state: "running"})
		}
	}
	return out
}

// rollingOut says whether the provider keeps a MachineDeployment's
// Nodes from scale-down for a rollout: a set labelled with its name,
// other than the one of the highest revision, still has replicas.
func (r *reader) rollingOut(ns, md string) bool {
	r.t.Helper()
	list, err := r.dyn.Resource(r.resource("machinesets")).Namespace(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: "cluster.x-k8s.io/deployment-name=" + md})
	if err != nil {
		r.t.Fatal(err)
	}
	latest := int64(0)
	revs := map[string]int64{}
	for _, ms := range list.Items {
		v := ms.GetAnnotations()["machinedeployment.clusters.x-k8s.io/revision"]
		if v == "" {
			v = "0"
		}
		rev, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			r.t.Fatalf("MachineSet %s: revision %q is not a number", ms.GetName(), v)
		}
		revs[ms.GetName()] = rev
		latest = max(latest, rev)
	}
	for _, ms := range list.Items {
		if revs[ms.GetName()] == latest {
			continue
		}
		spec, _, _ := unstructured.NestedInt64(ms.Object, "spec", "replicas")
		status, _, _ := unstructured.NestedInt64(ms.Object, "status", "replicas")
		if spec > 0 || status > 0 {
			return true
		}
	}
	return false
}

// replicas reads a node group's size from its /scale subresource.
func (r *reader) replicas(plural, ns, name string) int32 {
	r.t.Helper()
	s, err := r.dyn.Resource(r.resource(plural)).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{}, "scale")
	if err != nil {
		r.t.Fatal(err)
	}
	n, _, err := unstructured.NestedInt64(s.Object, "spec", "replicas")
	if err != nil {
		r.t.Fatal(err)
	}
	return int32(n)
}

// setSize writes a node group's size as the provider does: a merge
// patch of the /scale subresource, with no precondition.
func (r *reader) setSize(plural, ns, name string, n int32) {
	r.t.Helper()
	body := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n)
	if _, err := r.dyn.Resource(r.resource(plural)).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, body, metav1.PatchOptions{}, "scale"); err != nil {
		r.t.Fatalf("scaling %s %s to %d: %v", plural, name, n, err)
	}
}

// deleteNode is the provider's scale-down of one Node of a group: the
// Machine is marked with the delete annotation (a get and an update of
// the whole object), then the group's size is lowered by one.
func (r *reader) deleteNode(plural, ns, name string, m *unstructured.Unstructured) {
	r.t.Helper()
	ctx := context.Background()
	size := r.replicas(plural, ns, name)
	fresh, err := r.get("machines", m.GetNamespace(), m.GetName())
	if err != nil {
		r.t.Fatal(err)
	}
	a := fresh.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[deleteMachineKey] = time.Now().String()
	fresh.SetAnnotations(a)
	if _, err := r.dyn.Resource(r.resource("machines")).Namespace(ns).Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
		r.t.Fatalf("marking Machine %s: %v", m.GetName(), err)
	}
	r.setSize(plural, ns, name, size-1)
}

// bounds are a node group's min and max sizes; the provider skips a
// group without a max, and one invalid value stops all autoscaling.
func bounds(u *unstructured.Unstructured) (lo, hi int, err error) {
	a := u.GetAnnotations()
	if lo, err = strconv.Atoi(a[minSizeKey]); err != nil {
		return 0, 0, fmt.Errorf("min size %q: %w", a[minSizeKey], err)
	}
	if hi, err = strconv.Atoi(a[maxSizeKey]); err != nil {
		return 0, 0, fmt.Errorf("max size %q: %w", a[maxSizeKey], err)
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("bounds %d..%d", lo, hi)
	}
	return lo, hi, nil
}

func runtimeFromUnstructured(in map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(in, out)
}

// clusterOf is the cluster the provider's auto-discovery takes an object
// for: its spec.clusterName when the field is there, else its
// <group>/cluster-name label. Discovery by clusterName= drops every object
// on the way from a Node to its group (the Machine, its MachineSet, the
// MachineDeployment) whose cluster is another.
func clusterOf(u *unstructured.Unstructured) string {
	if name, found, _ := unstructured.NestedString(u.Object, "spec", "clusterName"); found {
		return name
	}
	return u.GetLabels()[group+"/cluster-name"]
}
