package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ManagementClusterName is the name of the one ManagementCluster.
const ManagementClusterName = "cluster"

// ManagementClusterJoinable is the ManagementCluster's condition saying
// whether machines can join the manager's own cluster, as
// WorkloadClusterJoinable says it of a WorkloadCluster: the same checks,
// the same reasons.
const ManagementClusterJoinable = "Joinable"

// ManagementClusterStatus is what the manager found of its own cluster.
type ManagementClusterStatus struct {
	// Conditions: Joinable, whether machines can join this cluster (those
	// of Machines with no spec.clusterName), from the checks that
	// machinist cluster prepare makes, repeated on a slow period and
	// after a Machine's failed join.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ManagementCluster is the cluster the manager runs against, the one
// whose Nodes the Machines with no spec.clusterName become, as a
// WorkloadCluster stands for a cluster of its own. There is one, named
// cluster; the manager makes it and keeps its status, and makes it
// again if it is deleted. It has no spec: what the manager's own
// machines join is set by its flags (--join-server, --join-ca-file).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster,categories=machinist
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'cluster'",message="there is one ManagementCluster, named cluster, and the manager makes it: it stands for the cluster the manager runs against"
// +kubebuilder:printcolumn:name="Joinable",type=string,JSONPath=`.status.conditions[?(@.type=="Joinable")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Joinable")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Joinable")].message`,priority=1
type ManagementCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status ManagementClusterStatus `json:"status,omitempty"`
}

// ManagementClusterList is a list of ManagementClusters: one at most.
// +kubebuilder:object:root=true
type ManagementClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ManagementCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ManagementCluster{}, &ManagementClusterList{})
}
