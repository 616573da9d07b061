// Package verbs holds the RBAC markers of the machinist-verbs ClusterRole,
// which the aggregated verbs server runs with: it reads Machines and
// records operations in their status, reads whether a Machine's
// WorkloadCluster can be reached (a drain cannot be where it cannot), asks
// the MachineDisruptionBudgets
// that select a Machine and records an admitted disruption in theirs, and
// it delegates authentication
// (TokenReview) and authorization (SubjectAccessReview) to kube-apiserver.
// It also needs the extension-apiserver-authentication-reader Role in
// kube-system, bound where it is deployed.
package verbs

// +kubebuilder:rbac:groups=machinist.dev,resources=machines,verbs=get;list
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/status,verbs=update
// +kubebuilder:rbac:groups=machinist.dev,resources=machinedisruptionbudgets,verbs=get;list
// +kubebuilder:rbac:groups=machinist.dev,resources=workloadclusters,verbs=get
// +kubebuilder:rbac:groups=machinist.dev,resources=machinedisruptionbudgets/status,verbs=update
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
