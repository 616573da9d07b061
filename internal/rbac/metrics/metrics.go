// Package metrics holds the RBAC marker of the machinist-metrics-reader
// ClusterRole: what a scraper (Prometheus' ServiceAccount) is bound to so
// that the manager's secure /metrics, and the verbs server's, answer it.
// Both delegate the question to kube-apiserver as a SubjectAccessReview
// of get on the non-resource URL /metrics; nothing else is granted, so
// binding it lets a scraper read metrics and no object.
package metrics

// +kubebuilder:rbac:urls=/metrics,verbs=get
