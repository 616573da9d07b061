// Package v1beta1 holds the machinist.dev/v1beta1 API: every kind of
// v1alpha1, with the changes docs/api.md's review asks for. It is the hub
// of conversion: every other version converts to and from it.
//
// Validation lives in the types as CEL rules (x-kubernetes-validations) so
// the API server rejects bad objects with a message a person can act on,
// before any controller sees them.
//
// +kubebuilder:object:generate=true
// +groupName=machinist.dev
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "machinist.dev", Version: "v1beta1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
