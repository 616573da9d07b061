// Package drain empties a Node: Round cordons it and evicts its pods
// through the Eviction API, one round at a time, and Rules decide what it
// does with each pod: evict it in some order, leave it, or wait for it to
// complete. The Machine controller's drain phase calls it through a
// nodes.Cluster. Rules are read from the MachineDrainRules that select a
// Machine and from each pod's drain label, and a Decision says which of
// them decided, so that a person can find out why.
//
// Precedence, from first to last:
//  1. the pod's machinist.dev/drain label (skip, wait-completed, order.<n>);
//  2. the first MachineDrainRule, by name, that selects the Machine and the
//     pod;
//  3. Drain, order 0.
package drain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Decision is what the drain does with one pod, and who said so.
type Decision struct {
	Behavior machinistv1.DrainBehavior
	// Order places a pod whose Behavior is Drain; 0 otherwise.
	Order int32
	// Source names what decided: "label machinist.dev/drain=...",
	// "MachineDrainRule <name>" or "default".
	Source string
	// Overruled names the other rules that select the pod, which lost to
	// Source.
	Overruled []string
}

// rule is one MachineDrainRule that selects the Machine, with its pod
// selectors parsed.
type rule struct {
	name     string
	behavior machinistv1.DrainBehavior
	order    *int32
	selector []podSelector // empty: every pod
}

type podSelector struct {
	pods, namespaces labels.Selector // nil: every one
}

// Rules are the MachineDrainRules that apply to one Machine's drain, in
// the order they take precedence.
type Rules struct {
	rules      []rule
	namespaces bool
}

// For returns the rules among all (the MachineDrainRules of m's namespace)
// that select m, by name. A rule whose selector cannot be parsed (which
// the CRD's validation leaves to the label library) is an error naming it:
// a drain that ignored it would evict what the rule was written to keep.
func For(m *machinistv1.Machine, all []machinistv1.MachineDrainRule) (Rules, error) {
	var out Rules
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b machinistv1.MachineDrainRule) int { return strings.Compare(a.Name, b.Name) })
	for _, r := range sorted {
		ok, err := selectsMachine(r, m)
		if err != nil {
			return Rules{}, err
		}
		if !ok {
			continue
		}
		parsed := rule{name: r.Name, behavior: r.Spec.Behavior, order: r.Spec.Order}
		for _, p := range r.Spec.Pods {
			var ps podSelector
			if p.Selector != nil {
				if ps.pods, err = metav1.LabelSelectorAsSelector(p.Selector.AsMeta()); err != nil {
					return Rules{}, fmt.Errorf("MachineDrainRule %s: pods selector: %w", r.Name, err)
				}
			}
			if p.NamespaceSelector != nil {
				if ps.namespaces, err = metav1.LabelSelectorAsSelector(p.NamespaceSelector.AsMeta()); err != nil {
					return Rules{}, fmt.Errorf("MachineDrainRule %s: pods namespaceSelector: %w", r.Name, err)
				}
				out.namespaces = true
			}
			parsed.selector = append(parsed.selector, ps)
		}
		out.rules = append(out.rules, parsed)
	}
	return out, nil
}

func selectsMachine(r machinistv1.MachineDrainRule, m *machinistv1.Machine) (bool, error) {
	if len(r.Spec.Machines) == 0 {
		return true, nil
	}
	for _, s := range r.Spec.Machines {
		sel, err := metav1.LabelSelectorAsSelector(s.Selector.AsMeta())
		if err != nil {
			return false, fmt.Errorf("MachineDrainRule %s: machines selector: %w", r.Name, err)
		}
		if sel.Matches(labels.Set(m.Labels)) {
			return true, nil
		}
	}
	return false, nil
}

// Names lists the rules, in precedence order.
func (r Rules) Names() []string {
	out := make([]string, len(r.rules))
	for i, ru := range r.rules {
		out[i] = ru.name
	}
	return out
}

// NeedNamespaces reports whether some rule selects pods by their
// namespace's labels, which Decide must then be given.
func (r Rules) NeedNamespaces() bool { return r.namespaces }

// Decide says what the drain does with pod, whose namespace carries
// namespaceLabels (needed only when NeedNamespaces).
func (r Rules) Decide(pod *corev1.Pod, namespaceLabels map[string]string) Decision {
	var d Decision
	labelled := false
	if v, ok := pod.Labels[machinistv1.DrainLabel]; ok {
		if b, order, err := ParseLabel(v); err == nil {
			d = Decision{Behavior: b, Order: order, Source: fmt.Sprintf("label %s=%s", machinistv1.DrainLabel, v)}
			labelled = true
		}
	}
	for _, ru := range r.rules {
		if !ru.selects(pod, namespaceLabels) {
			continue
		}
		if d.Source == "" {
			d = Decision{Behavior: ru.behavior, Source: "MachineDrainRule " + ru.name}
			if ru.behavior == machinistv1.DrainBehaviorDrain && ru.order != nil {
				d.Order = *ru.order
			}
			continue
		}
		d.Overruled = append(d.Overruled, ru.name)
	}
	if d.Source == "" {
		d = Decision{Behavior: machinistv1.DrainBehaviorDrain, Source: "default"}
	}
	if !labelled {
		if v, ok := pod.Labels[machinistv1.DrainLabel]; ok {
			d.Source += fmt.Sprintf(" (label %s=%q not understood: want skip, wait-completed or order.<n>)", machinistv1.DrainLabel, v)
		}
	}
	return d
}

func (ru rule) selects(pod *corev1.Pod, namespaceLabels map[string]string) bool {
	if len(ru.selector) == 0 {
		return true
	}
	for _, s := range ru.selector {
		if (s.pods == nil || s.pods.Matches(labels.Set(pod.Labels))) &&
			(s.namespaces == nil || s.namespaces.Matches(labels.Set(namespaceLabels))) {
			return true
		}
	}
	return false
}

// ParseLabel reads a pod's machinist.dev/drain label: "skip",
// "wait-completed" or "order.<n>" (n an integer).
func ParseLabel(v string) (machinistv1.DrainBehavior, int32, error) {
	switch v {
	case "skip":
		return machinistv1.DrainBehaviorSkip, 0, nil
	case "wait-completed":
		return machinistv1.DrainBehaviorWaitCompleted, 0, nil
	}
	if n, ok := strings.CutPrefix(v, "order."); ok {
		order, err := strconv.ParseInt(n, 10, 32)
		if err == nil {
			return machinistv1.DrainBehaviorDrain, int32(order), nil
		}
	}
	return "", 0, fmt.Errorf("%s=%q: want skip, wait-completed or order.<n>", machinistv1.DrainLabel, v)
}
