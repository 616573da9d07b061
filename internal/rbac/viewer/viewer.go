// Package viewer holds the RBAC markers of the machinist-viewer
// ClusterRole: read everything Machinist serves, change nothing.
package viewer

// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks;machinedisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/status;machinesets/status;machinedeployments/status;machinehealthchecks/status;machinedisruptionbudgets/status;machinesets/scale;machinedeployments/scale,verbs=get
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines,verbs=get
