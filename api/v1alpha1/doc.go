// Package v1alpha1 holds the machinist.dev/v1alpha1 API: Machine, MachineSet,
// MachineDeployment and MachineClass.
//
// Validation lives in the types as CEL rules (x-kubernetes-validations) so
// the API server rejects bad objects with a message a person can act on,
// before any controller sees them.
//
// Its kinds convert to and from v1beta1, the hub (conversion.go); the
// fields that match are converted by generated code.
//
// +kubebuilder:object:generate=true
// +k8s:conversion-gen=github.com/machinist-dev/machinist/api/v1beta1
// +groupName=machinist.dev
package v1alpha1
