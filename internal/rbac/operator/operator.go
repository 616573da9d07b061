// Package operator holds the RBAC markers of the machinist-machine-operator
// ClusterRole: people who may reboot and repair Machines. The verbs are
// PUT on subresources, so RBAC sees them as update on machines/reboot and
// machines/repair in the verbs group.
//
// It holds no patch on Machines: the annotation path (machinist.dev/request)
// is a patch, but the admission policy machinist-request admits it only for
// a requester with the verb's update, so a role that edits Machines grants
// the patch and this one the right to reboot or repair.
package operator

// The verbs, and reading the Machines they act on.
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines/reboot;machines/repair,verbs=update
// +kubebuilder:rbac:groups=subresources.machinist.dev,resources=machines,verbs=get
// WorkloadClusters are read to see which cluster a Machine serves; their
// kubeconfig Secrets are not: a cluster's credentials are granted apart.
// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks;machinedisruptionbudgets;machinedrainrules;workloadclusters,verbs=get;list;watch
// Adopting: a Machine created with spec.providerID takes an instance that
// exists (one that belongs to no Machine) instead of having one made. The
// admission policy machinist-adopt admits such a Machine only from someone
// with this verb, which no editing role grants: a tenant may make
// Machines, an operator decides which existing instances they may take.
// +kubebuilder:rbac:groups=machinist.dev,resources=machines,verbs=adopt
// Rollouts: pause, resume and undo change the MachineDeployment.
// +kubebuilder:rbac:groups=machinist.dev,resources=machinedeployments,verbs=patch;update
