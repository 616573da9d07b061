package v1beta1

// MachineTemplateSpec is the Machine a MachineSet or MachineDeployment stamps out.
// +kubebuilder:validation:XValidation:rule="!has(self.spec.providerID)",message="a template cannot set providerID: every Machine made from it gets its own instance"
type MachineTemplateSpec struct {
	// Metadata is given to every Machine made from this template.
	// +optional
	Metadata TemplateMetadata `json:"metadata,omitempty"`

	// Spec is the spec of every Machine made from this template.
	// +required
	Spec MachineSpec `json:"spec"`
}

// TemplateMetadata is the part of ObjectMeta a template may set.
type TemplateMetadata struct {
	// Labels are put on every Machine; the owner's selector must match them.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations are put on every Machine.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}
