// Package operator holds the RBAC markers of the machinist-machine-operator
// ClusterRole: people who may reboot and repair Machines. The verbs are
// PUT on subresources, so RBAC sees them as update on machines/reboot and
// machines/repair in the verbs group.
package operator

// The verbs, and reading the Machines they act on.
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines/reboot;machines/repair,verbs=update
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines,verbs=get
// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks,verbs=get;list;watch
// The annotation path (machinist.dev/request) is a patch of the Machine.
// +kubebuilder:rbac:groups=machinist.dev,resources=machines,verbs=patch
// Rollouts: pause, resume and undo change the MachineDeployment.
// +kubebuilder:rbac:groups=machinist.dev,resources=machinedeployments,verbs=patch;update
