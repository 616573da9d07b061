package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DrainBehavior is what a drain does with a pod.
// +kubebuilder:validation:Enum=Drain;Skip;WaitCompleted
type DrainBehavior string

// The behaviors a MachineDrainRule or a pod's drain label can give a pod.
const (
	// DrainBehaviorDrain evicts the pod, in the order its rule gives:
	// every pod of a lower order is gone before it is evicted.
	DrainBehaviorDrain DrainBehavior = "Drain"
	// DrainBehaviorSkip leaves the pod where it is: the drain neither
	// evicts it nor waits for it.
	DrainBehaviorSkip DrainBehavior = "Skip"
	// DrainBehaviorWaitCompleted never evicts the pod: the drain waits
	// until it has completed (Succeeded or Failed), as a Job's pod does.
	DrainBehaviorWaitCompleted DrainBehavior = "WaitCompleted"
)

// DrainLabel, on a pod, overrides every MachineDrainRule for that pod:
// "skip", "wait-completed", or "order.<n>" to drain it in order n
// ("order.-10", "order.5"). A label value cannot hold "=", nor start with
// "-", hence the dot.
const DrainLabel = "machinist.dev/drain"

// MachineDrainRuleDrain is what a rule does with the pods it selects.
// +kubebuilder:validation:XValidation:rule="!has(self.order) || self.behavior == 'Drain'",message="order can be set only with behavior Drain: Skip and WaitCompleted pods are never evicted, so they have no place in the order"
type MachineDrainRuleDrain struct {
	// Behavior is Drain (evict, in order), Skip (leave the pod) or
	// WaitCompleted (wait for the pod to complete, never evict it).
	// +required
	Behavior DrainBehavior `json:"behavior"`

	// Order places the selected pods in the drain: pods of a lower order
	// are evicted, and gone, before any pod of a higher order is evicted.
	// Pods no rule selects have order 0. Only with behavior Drain.
	// +kubebuilder:validation:Minimum=-1000000
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	Order *int32 `json:"order,omitempty"`
}

// MachineDrainRuleMachineSelector selects Machines by their labels.
type MachineDrainRuleMachineSelector struct {
	// Selector selects the Machines, in the rule's namespace, whose labels
	// it matches. An empty selector selects every Machine there.
	// +required
	Selector LabelSelector `json:"selector"`
}

// MachineDrainRulePodSelector selects pods by their labels and their
// namespace's labels; a pod is selected when both match.
type MachineDrainRulePodSelector struct {
	// Selector selects pods by their labels. Unset selects every pod.
	// +optional
	Selector *LabelSelector `json:"selector,omitempty"`

	// NamespaceSelector selects pods by their namespace's labels, in the
	// cluster the Machine's Node is in. Unset selects every namespace.
	// +optional
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
}

// MachineDrainRuleSpec says how the drain of the Machines the rule selects
// treats the pods it selects.
type MachineDrainRuleSpec struct {
	// Drain is what happens to the selected pods.
	// +required
	Drain MachineDrainRuleDrain `json:"drain"`

	// Machines selects the Machines, in the rule's namespace, whose drains
	// the rule applies to: those any entry selects. Empty selects every
	// Machine in the namespace.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, a == b))",message="each machines entry may be listed once"
	// +listType=atomic
	// +optional
	Machines []MachineDrainRuleMachineSelector `json:"machines,omitempty"`

	// Pods selects the pods the rule applies to: those any entry
	// selects. Empty selects every pod.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.selector) || has(p.namespaceSelector))",message="each pods entry needs a selector, a namespaceSelector or both; to select every pod, leave pods empty"
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, a == b))",message="each pods entry may be listed once"
	// +listType=atomic
	// +optional
	Pods []MachineDrainRulePodSelector `json:"pods,omitempty"`
}

// MachineDrainRule gives pods a drain behavior and order on the Machines it
// selects: databases last and their proxies first, a batch Job's pod waited
// for rather than evicted, a node-local agent left alone. When several
// rules select one pod, the rule whose name sorts first wins; a pod's
// machinist.dev/drain label overrides every rule. The Machine's Events say,
// for each drain, which rule placed which pods.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=mdr,categories=machinist
// +kubebuilder:deprecatedversion:warning="machinist.dev/v1alpha1 is deprecated; use machinist.dev/v1beta1"
// +kubebuilder:printcolumn:name="Behavior",type=string,JSONPath=`.spec.drain.behavior`
// +kubebuilder:printcolumn:name="Order",type=integer,JSONPath=`.spec.drain.order`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineDrainRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineDrainRuleSpec `json:"spec"`
}

// MachineDrainRuleList is a list of MachineDrainRules.
//
// +kubebuilder:object:root=true
type MachineDrainRuleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineDrainRule `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineDrainRule{}, &MachineDrainRuleList{})
}
