package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkloadClusterSpec says how the manager reaches a cluster whose Nodes
// its Machines become.
type WorkloadClusterSpec struct {
	// Kubeconfig names the Secret, in this WorkloadCluster's own namespace,
	// that holds a kubeconfig for the cluster. Cluster API's
	// "<cluster>-kubeconfig" Secret, with key "value", works as it is.
	// +required
	Kubeconfig KubeconfigReference `json:"kubeconfig"`

	// JoinEndpoint is the API server address new machines are given to
	// join the cluster, when it is not the kubeconfig's: a private
	// endpoint where the manager uses a public one, or a load balancer in
	// front of the control plane. Without it, machines join at the
	// kubeconfig's server with its CA. A change applies to the machines
	// given a join from then on; machines that joined already keep the
	// address they were given.
	// +optional
	JoinEndpoint *JoinEndpoint `json:"joinEndpoint,omitempty"`
}

// JoinEndpoint is where a new machine reaches the cluster's API server
// to join it, and the CA that verifies the server there.
type JoinEndpoint struct {
	// Server is the API server's URL as machines reach it:
	// https://host[:port], with no path, query, fragment or user.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self != ''",message="joinEndpoint.server is required: the https://host[:port] address at which machines join the cluster"
	// +kubebuilder:validation:XValidation:rule="self == '' || (isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != '')",message="server must be an https URL such as https://10.0.0.10:6443: https://, a host, and optionally a port"
	// +kubebuilder:validation:XValidation:rule="!isURL(self) || (url(self).getEscapedPath() in ['', '/'] && !self.contains('?') && !self.contains('#'))",message="server must be https://host[:port] alone, with no path, query or fragment: a machine joins the API server at its root"
	// +kubebuilder:validation:XValidation:rule="!isURL(self) || !self.contains('@')",message="server must not carry a user or password (user@host): a machine authenticates with its bootstrap token"
	// +required
	Server string `json:"server"`

	// CertificateAuthorityData is the PEM of the CA certificates that
	// verify the API server at Server. When empty, the CA of the
	// cluster's kubeconfig is used: leave it empty when the same CA
	// signs the certificate served at both addresses (list the join
	// endpoint's host in the API server's certificate), set it when the
	// join endpoint serves a certificate of another CA.
	// +optional
	CertificateAuthorityData []byte `json:"certificateAuthorityData,omitempty"`
}

// KubeconfigReference names a key of a Secret in the referring object's
// own namespace.
type KubeconfigReference struct {
	// Emptiness and "namespace/name" have rules of their own, which the
	// format rule passes by, so that each mistake gets one error that
	// names it.

	// SecretName is the Secret's name; it is always in the
	// WorkloadCluster's own namespace.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self != ''",message="secretName is required: name the Secret that holds the cluster's kubeconfig"
	// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="secretName is the name of a Secret in the WorkloadCluster's own namespace, not namespace/name: a Secret in another namespace cannot be named"
	// +kubebuilder:validation:XValidation:rule="self == '' || self.contains('/') || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="secretName must be the name of a Secret: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	// +required
	SecretName string `json:"secretName"`

	// Key is the key of the Secret's data holding the kubeconfig; "value"
	// when empty, as Cluster API writes it. It must be a key the API
	// server accepts in a Secret's data.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == '' || (self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && !self.startsWith('..'))",message="key must be a key of a Secret's data: letters, digits, '-', '_' and '.', and neither '.' nor starting with '..'"
	// +optional
	Key string `json:"key,omitempty"`
}

// DefaultKubeconfigKey is the Secret key read when KubeconfigReference.Key
// is empty: the one Cluster API's "<cluster>-kubeconfig" Secrets use.
const DefaultKubeconfigKey = "value"

// DataKey is the Secret data key that holds the kubeconfig.
func (r KubeconfigReference) DataKey() string {
	if r.Key == "" {
		return DefaultKubeconfigKey
	}
	return r.Key
}

// WorkloadClusterStatus is what the manager last saw of the cluster.
type WorkloadClusterStatus struct {
	// Conditions: Reachable (the manager can read the cluster's API; its
	// lastTransitionTime says since when) and Deleting (the cluster waits
	// for its Machines before it goes).
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Server is the address of the cluster's API server, from its
	// kubeconfig.
	// +optional
	Server string `json:"server,omitempty"`

	// Version is the version its API server reports.
	// +optional
	Version string `json:"version,omitempty"`

	// Nodes counts the cluster's Nodes when it was last probed.
	// +optional
	Nodes *int32 `json:"nodes,omitempty"`

	// Machines counts the Machines that serve this cluster.
	// +optional
	Machines *int32 `json:"machines,omitempty"`

	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Condition types and reasons of a WorkloadCluster.
const (
	// WorkloadClusterReachable is True while the manager can read the
	// cluster's API.
	WorkloadClusterReachable = "Reachable"
	// WorkloadClusterDeleting is True while a deleted WorkloadCluster
	// waits for its Machines to go (reason ReasonWaitingForMachines).
	WorkloadClusterDeleting = "Deleting"
	// WorkloadClusterJoinable is True while the checks of package
	// clusters/joinable, repeated on a slow period and after a Machine's
	// failed join, find that machines can join the cluster; False names
	// the first thing missing (its reason is the check's, such as
	// BootstrapTokensRefused or JoinBindingsMissing) and the flag or
	// command that fixes it.
	WorkloadClusterJoinable = "Joinable"

	// ReasonClusterConnected: the manager reads the cluster's API.
	ReasonClusterConnected = "Connected"
	// ReasonNoMachines: no Machine serves the cluster yet, so the manager
	// has not connected to it.
	ReasonNoMachines = "NoMachines"
	// ReasonNotFound: Machines name a WorkloadCluster that does
	// not exist (a reason of theirs: such a cluster has no status).
	ReasonNotFound = "NotFound"
	// ReasonClusterConnecting: the manager is starting its connection.
	ReasonClusterConnecting = "Connecting"
	// ReasonKubeconfigSecretMissing: the named Secret, or its key, is not
	// there.
	ReasonKubeconfigSecretMissing = "KubeconfigSecretMissing"
	// ReasonKubeconfigInvalid: the Secret's kubeconfig cannot be used.
	ReasonKubeconfigInvalid = "KubeconfigInvalid"
	// ReasonKubeconfigRefused: the Secret's kubeconfig asks the manager
	// for what a tenant's input may not: to run a command, to read a file
	// of the manager's, or to trust a server without verifying it. The
	// message names the field.
	ReasonKubeconfigRefused = "KubeconfigRefused"
	// ReasonUnreachable: the cluster's API server did not answer,
	// or refused the manager.
	ReasonUnreachable = "Unreachable"
)

// WorkloadClusterFinalizer holds a deleted WorkloadCluster until no Machine
// serves it: their Nodes, drains and deletions all need its API.
const WorkloadClusterFinalizer = "machinist.dev/workloadcluster"

// WorkloadCluster is a Kubernetes cluster whose Nodes this manager's
// Machines become. Machines name it in spec.clusterName.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=wc,categories=machinist
// +kubebuilder:printcolumn:name="Reachable",type=string,JSONPath=`.status.conditions[?(@.type=="Reachable")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Reachable")].reason`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.version`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Machines",type=integer,JSONPath=`.status.machines`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.status.server`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Reachable")].message`,priority=1
type WorkloadCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec WorkloadClusterSpec `json:"spec"`
	// +optional
	Status WorkloadClusterStatus `json:"status,omitempty"`
}

// WorkloadClusterList is a list of WorkloadClusters.
// +kubebuilder:object:root=true
type WorkloadClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WorkloadCluster{}, &WorkloadClusterList{})
}
