// Package editor holds the RBAC markers of the machinist-editor
// ClusterRole: what a tenant is given, bound with a RoleBinding in the
// tenant's namespace. It makes and changes Machinist's objects and scales
// sets, and nothing more: no status (only the controllers write what
// Machinist observed, such as a Machine's instance), no verbs (reboot and
// repair are machinist-machine-operator's), and not adopt, so a tenant
// cannot name an instance that exists for a Machine to take.
//
// Secrets are not in it: a WorkloadCluster's kubeconfig Secret is the
// tenant's own to write, granted apart, and whoever may read it holds
// that cluster's credentials.
package editor

// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks;machinedisruptionbudgets;machinedrainrules;workloadclusters,verbs=get;list;watch;create;update;patch;delete;deletecollection
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/status;machinesets/status;machinedeployments/status;machinehealthchecks/status;machinedisruptionbudgets/status;workloadclusters/status,verbs=get
// +kubebuilder:rbac:groups=machinist.dev,resources=machinesets/scale;machinedeployments/scale,verbs=get;update;patch
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines,verbs=get
