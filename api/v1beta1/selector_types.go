package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LabelSelector is metav1.LabelSelector with bounds on its size. The bounds
// let the API server afford the CEL rules that check a selector against a
// template's labels; without them it refuses the rules as too costly.
type LabelSelector struct {
	// MatchLabels selects objects that carry every one of these labels.
	// +kubebuilder:validation:MaxProperties=16
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`

	// MatchExpressions selects objects for which every expression holds.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is one expression of a LabelSelector. Its
// values must fit its operator here, where the object is written: the
// controllers' label helpers refuse a mismatch, so it would otherwise be
// accepted and then fail every reconcile.
// +kubebuilder:validation:XValidation:rule="(self.operator == 'In' || self.operator == 'NotIn') == (has(self.values) && size(self.values) > 0)",message="In and NotIn need at least one value; Exists and DoesNotExist take none"
type LabelSelectorRequirement struct {
	// Key is the label key the expression tests.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Key string `json:"key"`

	// Operator is In, NotIn, Exists or DoesNotExist.
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`

	// Values for In and NotIn; empty for Exists and DoesNotExist.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=atomic
	// +optional
	Values []string `json:"values,omitempty"`
}

// AsMeta returns the selector as the metav1 type that Kubernetes' label
// helpers take.
func (s LabelSelector) AsMeta() *metav1.LabelSelector {
	out := &metav1.LabelSelector{MatchLabels: s.MatchLabels}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: r.Key, Operator: r.Operator, Values: r.Values,
		})
	}
	return out
}
