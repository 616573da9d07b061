package machine

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// template is what a Machine should follow, and whose it is.
type template struct {
	spec  machinistv1.MachineSpec
	owner string
}

// templateOf returns the template m follows: its MachineDeployment's
// current one when a MachineDeployment owns m's MachineSet, else its
// MachineSet's; nil when no MachineSet owns m (or it is gone).
func (r *Reconciler) templateOf(ctx context.Context, m *machinistv1.Machine) (*template, error) {
	ref := metav1.GetControllerOf(m)
	if ref == nil || ref.Kind != "MachineSet" {
		return nil, nil
	}
	ms := &machinistv1.MachineSet{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, ms); err != nil || ms.UID != ref.UID {
		return nil, client.IgnoreNotFound(err)
	}
	if ref := metav1.GetControllerOf(ms); ref != nil && ref.Kind == "MachineDeployment" {
		md := &machinistv1.MachineDeployment{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, md)
		if apierrors.IsNotFound(err) || err == nil && md.UID != ref.UID {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return &template{spec: md.Spec.Template.Spec, owner: "MachineDeployment " + md.Name + "'s current template"}, nil
	}
	return &template{spec: ms.Spec.Template.Spec, owner: "MachineSet " + ms.Name + "'s template"}, nil
}

// setDrift keeps m's Drifted condition: whether its spec differs from the
// template it follows, and how. It rides on the reconcile's one status
// write; a template change wakes the Machines it concerns a while later
// (see templateChanged), which costs a Machine still drifted by then one
// write.
func (r *Reconciler) setDrift(ctx context.Context, m *machinistv1.Machine) error {
	t, err := r.templateOf(ctx, m)
	if err != nil {
		return err
	}
	if t == nil {
		meta.RemoveStatusCondition(&m.Status.Conditions, machinistv1.ConditionDrifted)
		return nil
	}
	c := metav1.Condition{Type: machinistv1.ConditionDrifted, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonUpToDate,
		Message: "the spec is " + t.owner, ObservedGeneration: m.Generation}
	if diff := specDiff(m.Spec, t.spec); diff != "" {
		c.Status, c.Reason = metav1.ConditionTrue, machinistv1.ReasonTemplateChanged
		c.Message = "the spec differs from " + t.owner + ": " + diff
	}
	meta.SetStatusCondition(&m.Status.Conditions, c)
	return nil
}

// specDiff says how a Machine's spec differs from a template's, "" when it
// does not; the Machine's own providerID does not count.
func specDiff(m, t machinistv1.MachineSpec) string {
	var out []string
	if m.Version != t.Version {
		out = append(out, fmt.Sprintf("version %s, template %s", orNone(m.Version), orNone(t.Version)))
	}
	if m.ClassRef != t.ClassRef {
		out = append(out, fmt.Sprintf("class %s, template %s", orNone(m.ClassRef.Name), orNone(t.ClassRef.Name)))
	}
	if m.ClusterName != t.ClusterName {
		out = append(out, fmt.Sprintf("cluster %s, template %s", orNone(m.ClusterName), orNone(t.ClusterName)))
	}
	if !maps.Equal(m.NodeLabels, t.NodeLabels) {
		out = append(out, "nodeLabels")
	}
	if !equality.Semantic.DeepEqual(m.NodeTaints, t.NodeTaints) {
		out = append(out, "nodeTaints")
	}
	if !equality.Semantic.DeepEqual(m.Drain, t.Drain) {
		out = append(out, "drain")
	}
	return strings.Join(out, "; ")
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// DefaultDriftDelay is how long after a template changes its Machines are
// looked at for drift. A rollout usually deals with a Machine first (an
// in-place update rewrites its spec, a replacement deletes it), and the
// condition then rides on a write the Machine gets anyway, or on none: a
// Machine would otherwise cost one more write per template change, said
// seconds before it is updated or gone. A Machine still drifted after the
// delay (a paused or held rollout, a long one's later waves) shows it.
const DefaultDriftDelay = 30 * time.Second

// templateChanged wakes, DriftDelay later, the Machines of a MachineSet or
// MachineDeployment whose template spec changed: replicas, pausing or a new
// status wake none.
func (r *Reconciler) templateChanged() handler.Funcs {
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if equality.Semantic.DeepEqual(templateSpec(e.ObjectOld), templateSpec(e.ObjectNew)) {
				return
			}
			delay := r.DriftDelay
			if delay <= 0 {
				delay = DefaultDriftDelay
			}
			for _, req := range r.machinesForTemplate(ctx, e.ObjectNew) {
				q.AddAfter(req, delay)
			}
		},
	}
}

func templateSpec(o client.Object) *machinistv1.MachineSpec {
	switch o := o.(type) {
	case *machinistv1.MachineSet:
		return &o.Spec.Template.Spec
	case *machinistv1.MachineDeployment:
		return &o.Spec.Template.Spec
	}
	return nil
}

// machinesForTemplate maps a MachineSet or MachineDeployment whose template
// changed to the Machines its selector matches.
func (r *Reconciler) machinesForTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var sel machinistv1.LabelSelector
	var kind string
	switch o := o.(type) {
	case *machinistv1.MachineSet:
		sel, kind = o.Spec.Selector, "MachineSet"
	case *machinistv1.MachineDeployment:
		sel, kind = o.Spec.Selector, "MachineDeployment"
	default:
		return nil
	}
	selector, err := metav1.LabelSelectorAsSelector(sel.AsMeta())
	if err != nil || selector.Empty() {
		return nil
	}
	return r.machinesMatching(ctx, kind+" "+o.GetName(),
		client.InNamespace(o.GetNamespace()), client.MatchingLabelsSelector{Selector: selector})
}
