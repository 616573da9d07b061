package machine

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/machinist-dev/machinist/internal/patch"
)

// applyNodeSpec puts the class's and the Machine's labels and taints on the
// Node, writing only when something is missing or different. Labels and
// taints that others set are left alone.
//
// With uncordon, the same patch also makes the Node schedulable again,
// as the end of an operation that drained it.
func (r *Reconciler) applyNodeSpec(ctx context.Context, s *step, node *corev1.Node, uncordon bool) error {
	m, class := s.m, s.class
	labels := map[string]string{}
	var taints []corev1.Taint
	if class != nil && class.Spec.NodeTemplate != nil {
		for k, v := range class.Spec.NodeTemplate.NodeLabels {
			labels[k] = v
		}
		for _, t := range class.Spec.NodeTemplate.NodeTaints {
			taints = append(taints, t.AsCore())
		}
	}
	for k, v := range m.Spec.NodeLabels {
		labels[k] = v
	}
	for _, t := range m.Spec.NodeTaints {
		taints = setTaint(taints, t.AsCore())
	}

	// A JSON patch of just what changes. Labels are set key by key, so
	// others' labels stay; taints are one atomic list, so setting them is
	// tested against the list this change was computed from: a taint that
	// the node lifecycle controller, a user or another controller added or
	// removed since the cache saw the Node is never undone by a list from
	// before it (a Conflict, and the change is decided again).
	var p patch.JSON
	for k, v := range labels {
		if have, ok := node.Labels[k]; ok && have == v {
			continue
		}
		if len(node.Labels) == 0 {
			// No map to add a key to: the whole map is set, and, like
			// the taints, only if there is still none, so that labels
			// another writer put on the Node since the cache saw it
			// without any are not replaced by ours alone.
			p.Test("/metadata/labels", nil)
			p.Set("/metadata/labels", labels)
			break
		}
		p.Set("/metadata/labels/"+patch.Key(k), v)
	}
	want := node.Spec.Taints
	for _, t := range taints {
		want = setTaint(want, t)
	}
	if !equalTaints(node.Spec.Taints, want) {
		var had any // a Node without taints has no such field
		if len(node.Spec.Taints) > 0 {
			had = node.Spec.Taints
		}
		p.Test("/spec/taints", had)
		p.Set("/spec/taints", want)
	}
	if uncordon && node.Spec.Unschedulable {
		p.Set("/spec/unschedulable", false)
	}
	if p.Empty() {
		return nil
	}
	return patch.Conflict(s.nodes.Patch(ctx, node.DeepCopy(), p.Patch()))
}

// setTaint adds t, replacing a taint with the same key and effect.
func setTaint(taints []corev1.Taint, t corev1.Taint) []corev1.Taint {
	for i := range taints {
		if taints[i].Key == t.Key && taints[i].Effect == t.Effect {
			if taints[i].Value != t.Value {
				out := append([]corev1.Taint(nil), taints...)
				out[i].Value = t.Value
				return out
			}
			return taints
		}
	}
	return append(append([]corev1.Taint(nil), taints...), t)
}

func equalTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].MatchTaint(&b[i]) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}
