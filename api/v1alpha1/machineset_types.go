package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeletePolicy chooses which Machines a MachineSet removes first when it
// scales down, after Machines already deleting, marked for deletion,
// Failed or not yet Running.
// +kubebuilder:validation:Enum=Random;Newest;Oldest
type DeletePolicy string

// The delete policies.
const (
	// DeleteRandom removes Machines in no particular order.
	DeleteRandom DeletePolicy = "Random"
	// DeleteNewest removes the most recently created Machines first.
	DeleteNewest DeletePolicy = "Newest"
	// DeleteOldest removes the oldest Machines first.
	DeleteOldest DeletePolicy = "Oldest"
)

// DeleteMachineAnnotation marks a Machine to be removed first when its
// MachineSet scales down.
const DeleteMachineAnnotation = "machinist.dev/delete-machine"

// Reasons of a MachineSet's Ready condition (beside ReasonDisruptionHeld).
const (
	// ReasonAllMachinesReady: the set has its replicas, all Ready.
	ReasonAllMachinesReady = "AllMachinesReady"
	// ReasonScaling: the set is creating or deleting Machines.
	ReasonScaling = "Scaling"
	// ReasonWaitingForMachines: the set has its replicas, not all Ready.
	ReasonWaitingForMachines = "WaitingForMachines"
)

// MachineSetSpec is how many Machines of one template should exist.
// +kubebuilder:validation:XValidation:rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="selector must not be empty: an empty selector would claim every Machine in the namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.template.metadata) && has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])",message="selector does not match the template's labels: every Machine made from the template must be selected by the selector"
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchExpressions) || self.selector.matchExpressions.all(e, e.operator == 'In' ? (has(self.template.metadata) && has(self.template.metadata.labels) && e.key in self.template.metadata.labels && has(e.values) && self.template.metadata.labels[e.key] in e.values) : e.operator == 'NotIn' ? (!has(self.template.metadata) || !has(self.template.metadata.labels) || !(e.key in self.template.metadata.labels) || !has(e.values) || !(self.template.metadata.labels[e.key] in e.values)) : e.operator == 'Exists' ? (has(self.template.metadata) && has(self.template.metadata.labels) && e.key in self.template.metadata.labels) : (!has(self.template.metadata) || !has(self.template.metadata.labels) || !(e.key in self.template.metadata.labels)))",message="selector's matchExpressions do not match the template's labels: every Machine made from the template must be selected by the selector"
type MachineSetSpec struct {
	// Replicas is how many Machines should exist.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="replicas must be zero or more"
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Selector picks the Machines this set owns. It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="selector is immutable: create a new MachineSet to select other Machines"
	// +required
	Selector LabelSelector `json:"selector"`

	// Template is the Machine this set creates.
	// +required
	Template MachineTemplateSpec `json:"template"`

	// DeletePolicy chooses which Machines go first on scale-down.
	// +kubebuilder:default=Random
	// +optional
	DeletePolicy DeletePolicy `json:"deletePolicy,omitempty"`

	// MinReadySeconds is how long a Machine must be Ready before it counts
	// as available.
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="minReadySeconds must be zero or more"
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`
}

// MachineSetStatus is what the MachineSet controller observed.
type MachineSetStatus struct {
	// Replicas is how many Machines the set owns.
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas is how many owned Machines have a Ready Node.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// AvailableReplicas is how many have been Ready for minReadySeconds.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas,omitempty"`

	// ObservedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Selector is spec.selector as a string, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Conditions report the set's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineSet keeps a number of identical Machines.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:deprecatedversion:warning="machinist.dev/v1alpha1 is deprecated; use machinist.dev/v1beta1"
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=ms,categories=machinist
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineSetSpec `json:"spec"`
	// +optional
	Status MachineSetStatus `json:"status,omitempty"`
}

// MachineSetList is a list of MachineSets.
//
// +kubebuilder:object:root=true
type MachineSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineSet `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineSet{}, &MachineSetList{})
}
