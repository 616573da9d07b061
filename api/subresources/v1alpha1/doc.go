// Package v1alpha1 holds the subresources.machinist.dev/v1alpha1 API: the
// option bodies of the Machine verbs (reboot, repair) and the answer the
// verbs server gives when it accepts one.
//
// The group is not machinist.dev on purpose: a CRD in the same group and
// version would take the aggregated APIService over.
//
// +kubebuilder:object:generate=true
// +k8s:openapi-gen=true
// +groupName=subresources.machinist.dev
package v1alpha1
