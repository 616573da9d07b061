package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// MachineClassSpec says which provider builds a class's Machines and how.
type MachineClassSpec struct {
	// Provider names the actuator that creates, reboots, repairs and deletes
	// this class's Machines, for example "inmemory" or "process".
	// +kubebuilder:validation:XValidation:rule="size(self) > 0",message="provider is required: name the actuator that builds these Machines, for example inmemory or process"
	// It may change: a Machine that has an instance is driven by the
	// provider its providerID names, so a changed class only changes
	// which provider builds its next Machines, and a class whose
	// provider is misspelled can be fixed.
	// +kubebuilder:validation:MaxLength=63
	// +required
	Provider string `json:"provider"`

	// ProviderSpec is opaque to Machinist and handed to the provider as is.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +optional
	ProviderSpec runtime.RawExtension `json:"providerSpec,omitempty"`

	// NodeTemplate describes the Nodes this class's Machines become, so that
	// schedulers and autoscalers can plan before a Machine exists.
	// +optional
	NodeTemplate *NodeTemplate `json:"nodeTemplate,omitempty"`

	// Drain holds the drain defaults for this class's Machines.
	// +optional
	Drain *DrainSettings `json:"drain,omitempty"`
}

// NodeTemplate is what a class's Nodes will look like.
type NodeTemplate struct {
	// Capacity is the resources each Node offers, such as cpu and memory.
	// Its keys are resource names, as a Node's are: providers hand them
	// on to the machine, where a key that is not one (with a space, say)
	// could say more than a resource.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !format.qualifiedName().validate(k).hasValue())",message="every capacity key must be a resource name such as cpu, memory, hugepages-2Mi or nvidia.com/gpu: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally after a DNS subdomain prefix and '/'"
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`

	// NodeLabels are put on every Node of this class, as a Machine's
	// spec.nodeLabels are on its own.
	// +optional
	NodeLabels NodeLabels `json:"nodeLabels,omitempty"`

	// NodeTaints are put on every Node of this class, as a Machine's
	// spec.nodeTaints are on its own.
	// +optional
	NodeTaints NodeTaints `json:"nodeTaints,omitempty"`
}

// MachineClass is a kind of machine: which provider builds it, with what
// provider settings, what its Nodes look like and how they are drained.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=mc,categories=machinist
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineClassSpec `json:"spec"`
}

// MachineClassList is a list of MachineClasses.
//
// +kubebuilder:object:root=true
type MachineClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineClass `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineClass{}, &MachineClassList{})
}
