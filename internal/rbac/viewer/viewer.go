// Package viewer holds the RBAC markers of the machinist-viewer
// ClusterRole: read everything Machinist serves, change nothing.
//
// It reads WorkloadClusters but never Secrets: a WorkloadCluster only names
// the Secret of its kubeconfig, and whoever may read that Secret holds the
// cluster's credentials, which no viewer should.
package viewer

// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks;machinedisruptionbudgets;machinedrainrules;workloadclusters;managementclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/status;machinesets/status;machinedeployments/status;machinehealthchecks/status;machinedisruptionbudgets/status;workloadclusters/status;managementclusters/status;machinesets/scale;machinedeployments/scale,verbs=get
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines,verbs=get
