package v1beta1

import (
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachinePhase is where a Machine stands in its lifecycle. The lifecycle
// package's state machine is the only thing that moves a Machine from one
// phase to another.
// +kubebuilder:validation:Enum=Pending;Provisioning;Running;Draining;Rebooting;Repairing;Updating;Deleting;Failed
type MachinePhase string

// The phases a Machine passes through.
const (
	// MachinePending: accepted, nothing created yet.
	MachinePending MachinePhase = "Pending"
	// MachineProvisioning: the provider is creating the instance and its Node
	// has not yet become Ready.
	MachineProvisioning MachinePhase = "Provisioning"
	// MachineRunning: the Node is registered and Ready.
	MachineRunning MachinePhase = "Running"
	// MachineDraining: the Node is cordoned and its pods are being evicted.
	MachineDraining MachinePhase = "Draining"
	// MachineRebooting: the provider is rebooting the instance.
	MachineRebooting MachinePhase = "Rebooting"
	// MachineRepairing: the provider is re-imaging the instance.
	MachineRepairing MachinePhase = "Repairing"
	// MachineUpdating: the provider is changing the instance in place to
	// the Machine's spec (a new version); the Machine and its Node keep
	// their names.
	MachineUpdating MachinePhase = "Updating"
	// MachineDeleting: the provider is destroying the instance.
	MachineDeleting MachinePhase = "Deleting"
	// MachineFailed: the Machine cannot make progress without a person.
	MachineFailed MachinePhase = "Failed"
)

// ClassReference names a MachineClass in the Machine's own namespace.
type ClassReference struct {
	// Name of the MachineClass.
	// +kubebuilder:validation:XValidation:rule="size(self) > 0",message="classRef.name is required: name the MachineClass this Machine is built from"
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// MachineSpec is what a Machine should be.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.providerID) || has(self.providerID)",message="providerID cannot be removed once set"
// +kubebuilder:validation:XValidation:rule="has(oldSelf.providerID) || !has(self.providerID)",message="providerID can be set only when the Machine is created (a Machine adopts its instance as it is provisioned, not after): create a new Machine that names the instance"
type MachineSpec struct {
	// ClassRef names the MachineClass that says which provider builds this
	// Machine and how.
	// +required
	ClassRef ClassReference `json:"classRef"`

	// Version is the node (kubelet) version this Machine runs. Changing it in
	// a MachineDeployment's template rolls every Machine to the new version;
	// changing it on a Running Machine updates that Machine in place, if its
	// provider can.
	// It is v, then major.minor.patch, with an optional pre-release
	// (v1.38.0-rc.1) and build metadata (v1.37.2+k3s1); empty leaves the
	// choice to the provider.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches('^v(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)(-[0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?([+][0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?$')",message="version must be a Kubernetes version such as v1.37.2 or v1.38.0-rc.1"
	// +optional
	Version string `json:"version,omitempty"`

	// ProviderID names an existing provider instance for this Machine to
	// adopt instead of creating one. It is set when the Machine is created
	// and never changes.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="providerID is immutable once set: delete the Machine and create a new one to use another instance"
	// +kubebuilder:validation:MaxLength=512
	// +optional
	ProviderID string `json:"providerID,omitempty"`

	// The "namespace/name" rule comes first and the format rule passes
	// such a value by, so that the likeliest mistake, reaching for another
	// namespace, gets the one error that names it.

	// ClusterName names the WorkloadCluster, in this Machine's own
	// namespace, whose Node this Machine becomes. Empty means the cluster
	// Machinist itself runs in. A Machine serves one cluster for life: its
	// clusterName is refused any change after creation. In a template it
	// may change like any other field, and the Machines made from it then
	// are new ones in the new cluster.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="clusterName is the name of a WorkloadCluster in the Machine's own namespace, not namespace/name: a Machine cannot serve a cluster declared in another namespace"
	// +kubebuilder:validation:XValidation:rule="self == '' || self.contains('/') || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="clusterName must be the name of a WorkloadCluster: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	// +optional
	ClusterName string `json:"clusterName,omitempty"`

	// NodeLabels are put on this Machine's Node, in addition to the class's.
	// +optional
	NodeLabels NodeLabels `json:"nodeLabels,omitempty"`

	// NodeTaints are put on this Machine's Node, in addition to the class's.
	// +optional
	NodeTaints NodeTaints `json:"nodeTaints,omitempty"`

	// Drain overrides the class's drain settings for this Machine.
	// +optional
	Drain *DrainSettings `json:"drain,omitempty"`
}

// NodeInfo is what a Node reports about itself (corev1.NodeSystemInfo),
// copied into a type of Machinist's own so that the API does not change
// with each Kubernetes release.
type NodeInfo struct {
	// MachineID is the machine's /etc/machine-id.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	MachineID string `json:"machineID,omitempty"`
	// SystemUUID is the machine's system UUID.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	SystemUUID string `json:"systemUUID,omitempty"`
	// BootID is the boot ID the Node reported.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	BootID string `json:"bootID,omitempty"`
	// KernelVersion is the kernel's version (uname -r).
	// +kubebuilder:validation:MaxLength=256
	// +optional
	KernelVersion string `json:"kernelVersion,omitempty"`
	// OSImage is the operating system's name (/etc/os-release).
	// +kubebuilder:validation:MaxLength=256
	// +optional
	OSImage string `json:"osImage,omitempty"`
	// ContainerRuntimeVersion is the container runtime's name and version.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	ContainerRuntimeVersion string `json:"containerRuntimeVersion,omitempty"`
	// KubeletVersion is the kubelet's version.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	// OperatingSystem is the operating system, such as linux.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	OperatingSystem string `json:"operatingSystem,omitempty"`
	// Architecture is the machine's architecture, such as amd64.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Architecture string `json:"architecture,omitempty"`
}

// NodeReference names the Node a Machine became.
type NodeReference struct {
	// Name of the Node.
	Name string `json:"name"`
	// UID of the Node, so a Node re-created under the same name is noticed.
	// +optional
	UID string `json:"uid,omitempty"`
}

// Annotations on a Machine that users and other controllers set.
const (
	// PreDrainHookPrefix starts the name of an annotation that holds a
	// Machine in Draining, before its Node is cordoned, until removed. Each
	// hook owner uses its own suffix: pre-drain.hook.machinist.dev/<owner>.
	PreDrainHookPrefix = "pre-drain.hook.machinist.dev/"

	// PreTerminateHookPrefix starts the name of an annotation that holds
	// a deleted Machine in Deleting, after its drain and the detach of its
	// volumes and before its provider is asked to delete the instance,
	// until removed: a storage or backup agent's last look at the
	// machine. Each owner uses its own suffix:
	// pre-terminate.hook.machinist.dev/<owner>.
	PreTerminateHookPrefix = "pre-terminate.hook.machinist.dev/"

	// RequestAnnotation asks for a verb where the aggregated verbs server
	// is not available: "reboot" or "repair". The Machine controller turns
	// it into the same status.operation and removes it.
	RequestAnnotation = "machinist.dev/request"

	// LastRequestAnnotation holds the operation ID the last
	// RequestAnnotation became. It is written in the same update that
	// removes the request, so a controller that crashed after recording
	// the operation can tell the request was already taken.
	LastRequestAnnotation = "machinist.dev/last-request"

	// RequestedByAnnotation names who set RequestAnnotation. The
	// admission policies in config/admission write it (kube-apiserver
	// stamps the requester's user name) and refuse any other value, so the
	// controller can record it as the operation's requestedBy. It is
	// removed with the request.
	RequestedByAnnotation = "machinist.dev/requested-by"

	// VersionRequestedByAnnotation names who last changed spec.version,
	// which updates the Machine in place. The admission policies in
	// config/admission write it and refuse any other value; the controller
	// records it as the Update's requestedBy.
	VersionRequestedByAnnotation = "machinist.dev/version-requested-by"
)

// Annotations the Machine controller keeps on each Machine's Node, in the
// Node's own cluster, so that a reader holding only the Node finds its
// Machine: the Kubernetes cluster-autoscaler's clusterapi provider reads
// the first two (with CAPI_GROUP=machinist.dev), as it reads Cluster API's.
// The Machine keeps its providerID in status, which that provider does
// not index, so these are how it tells a Node's node group.
const (
	// NodeMachineAnnotation is the name of the Node's Machine.
	NodeMachineAnnotation = "machinist.dev/machine"
	// NodeClusterNamespaceAnnotation is the namespace of the Node's
	// Machine.
	NodeClusterNamespaceAnnotation = "machinist.dev/cluster-namespace"
	// NodeClusterNameAnnotation is the Machine's spec.clusterName: the
	// WorkloadCluster that holds the Node. A Node of the management
	// cluster itself has none.
	NodeClusterNameAnnotation = "machinist.dev/cluster-name"
)

// MachineFinalizer keeps a Machine until its instance and Node are gone.
const MachineFinalizer = "machinist.dev/machine"

// Condition types of a Machine.
const (
	// ConditionNodeHealthy is True while the Machine's Node is Ready and its
	// kubelet's Lease is renewed in time.
	ConditionNodeHealthy = "NodeHealthy"
	// ConditionDrained reports the drain in progress or its outcome.
	ConditionDrained = "Drained"
	// ConditionDrifted is True while the Machine's spec differs from the
	// template it should follow: its MachineDeployment's current one, or
	// its MachineSet's when no MachineDeployment owns the set. A Machine
	// of neither has no such condition.
	ConditionDrifted = "Drifted"
	// ConditionBootConfirmed is set on a Machine whose reboot or repair was
	// completed on its provider's word while its cluster could not be
	// reached: Unknown until the Node is seen again, then True when the
	// Node reports the boot ID the provider did, False when it does not.
	ConditionBootConfirmed = "BootConfirmed"
	// ConditionVolumesDetached reports the wait, before a Machine's
	// instance is deleted or repaired, for the VolumeAttachments that
	// name its Node to go: False with reason VolumeDetach while it waits
	// (since its lastTransitionTime), True once none is left, False with
	// reason VolumeDetachTimeout once the wait was given up.
	ConditionVolumesDetached = "VolumesDetached"
	// ConditionNodeDeleted is set on a deleted Machine whose instance is
	// gone while its Node's deletion fails: False with reason
	// NodeDeletion (since its lastTransitionTime, when the first attempt
	// failed) until the Node is deleted or the wait is given up.
	ConditionNodeDeleted = "NodeDeleted"
)

// Reasons of the waits between a Machine's drain and the deletion of its
// instance (conditions VolumesDetached and NodeDeleted, and the Ready
// condition of a Machine that waits in Deleting).
const (
	// ReasonVolumeDetach: VolumeAttachments still name the Machine's Node.
	ReasonVolumeDetach = "VolumeDetach"
	// ReasonVolumesDetached: no VolumeAttachment names the Node.
	ReasonVolumesDetached = "VolumesDetached"
	// ReasonVolumeDetachTimeout: the volume-detach timeout passed; what
	// follows went ahead with volumes still attached.
	ReasonVolumeDetachTimeout = "VolumeDetachTimeout"
	// ReasonVolumeDetachSkipped: VolumeAttachments name the Node, but the
	// Node is unreachable (its kubelet silent), so none can be detached
	// through it; what follows went ahead without waiting.
	ReasonVolumeDetachSkipped = "VolumeDetachSkipped"
	// ReasonPreTerminateHook: pre-terminate hook annotations hold the
	// deletion of the instance.
	ReasonPreTerminateHook = "PreTerminateHook"
	// ReasonNodeDeletion: the instance is gone and the Node's deletion
	// fails; it is tried again until the node-deletion timeout.
	ReasonNodeDeletion = "NodeDeletion"
	// ReasonNodeDeletionTimeout: the Node's deletion failed for longer
	// than the node-deletion timeout and was given up; the Machine went.
	ReasonNodeDeletionTimeout = "NodeDeletionTimeout"
)

// Reasons of a Machine's BootConfirmed condition.
const (
	// ReasonNodeNotSeen: the Node has not been seen since the provider
	// reported the new boot.
	ReasonNodeNotSeen = "NodeNotSeen"
	// ReasonBootIDMatches: the Node reports the boot ID the provider did.
	ReasonBootIDMatches = "BootIDMatches"
	// ReasonBootIDMismatch: the Node reports another boot ID than the
	// provider did: the machine booted again since, or the provider's
	// word was wrong.
	ReasonBootIDMismatch = "BootIDMismatch"
)

// Reasons of a Machine's NodeHealthy condition (and of its Ready
// condition while it runs).
const (
	// ReasonNodeReady: the Node is Ready and its kubelet's Lease renewed.
	ReasonNodeReady = "NodeReady"
	// ReasonNodeNotFound: no Node has the Machine's providerID.
	ReasonNodeNotFound = "NodeNotFound"
	// ReasonNodeNotReady: the Node does not report Ready=True.
	ReasonNodeNotReady = "NodeNotReady"
	// ReasonNodeLeaseExpired: the kubelet has not renewed its Lease within
	// the Lease's duration; a dead kubelet cannot report NotReady itself.
	ReasonNodeLeaseExpired = "NodeLeaseExpired"
)

// Reasons of a Machine's Ready condition while it waits for its provider
// (the Ready condition of a Running Machine carries its NodeHealthy
// reason).
const (
	// ReasonProvisioning: the instance is made; its Node is not Ready yet.
	ReasonProvisioning = "Provisioning"
	// ReasonCreateError: the provider failed to create the instance; it
	// is tried again.
	ReasonCreateError = "CreateError"
	// ReasonProviderError: the provider failed to reboot, repair or
	// update the instance; it is tried again.
	ReasonProviderError = "ProviderError"
	// ReasonDeleteError: the provider failed to destroy the instance, or
	// it still exists; it is tried again.
	ReasonDeleteError = "DeleteError"
	// ReasonMachineClassNotFound: the MachineClass the Machine names does
	// not exist.
	ReasonMachineClassNotFound = "MachineClassNotFound"
	// ReasonProviderNotFound: no provider of the name the class or the
	// providerID's scheme gives is registered.
	ReasonProviderNotFound = "ProviderNotFound"
	// ReasonProviderUnavailable: the provider runs out of process and
	// does not answer. Whatever the Machine was doing waits for it.
	ReasonProviderUnavailable = "ProviderUnavailable"
	// ReasonClusterUnreachable: the Machine's WorkloadCluster cannot be
	// reached (its Reachable condition says why). Whatever the Machine was
	// doing on the Node side waits for it.
	ReasonClusterUnreachable = "ClusterUnreachable"
	// ReasonInvalidProviderID: status.providerID does not start with
	// <provider>://.
	ReasonInvalidProviderID = "InvalidProviderID"
)

// Reasons of a Provisioning Machine's Ready condition when its machine
// reports, through its provider, why its join is failing (the message is
// the machine's, and says what to change on the cluster). A Machine whose
// WorkloadCluster is not Joinable waits with that condition's reason
// instead.
const (
	// ReasonBootstrapTokenRefused: the cluster did not accept the
	// machine's bootstrap token (401).
	ReasonBootstrapTokenRefused = "BootstrapTokenRefused"
	// ReasonJoinForbidden: the token authenticated, but may not ask for a
	// node certificate (403): the join bindings are missing.
	ReasonJoinForbidden = "JoinForbidden"
	// ReasonJoinCertificateNotApproved: the machine's certificate request
	// was not approved in time.
	ReasonJoinCertificateNotApproved = "CertificateNotApproved"
	// ReasonJoinCertificateDenied: the certificate request was denied or
	// failed.
	ReasonJoinCertificateDenied = "CertificateDenied"
	// ReasonJoinCertificateNotIssued: the request was approved but no
	// certificate was issued in time: no signer.
	ReasonJoinCertificateNotIssued = "CertificateNotIssued"
	// ReasonJoinServerUnreachable: the machine cannot reach, or cannot
	// verify, the API server it was told to join.
	ReasonJoinServerUnreachable = "JoinServerUnreachable"
	// ReasonJoinFailed: any other failed join.
	ReasonJoinFailed = "JoinFailed"
)

// JoinFailureReasons are the reasons above, each a machine's report of a
// failing join.
var JoinFailureReasons = []string{
	ReasonBootstrapTokenRefused, ReasonJoinForbidden, ReasonJoinCertificateNotApproved,
	ReasonJoinCertificateDenied, ReasonJoinCertificateNotIssued, ReasonJoinServerUnreachable, ReasonJoinFailed,
}

// Reasons of a Failed Machine's Ready condition.
const (
	FailureCreate              = "CreateFailed"
	FailureProvisioningTimeout = "ProvisioningTimeout"
	FailureRebootTimeout       = "RebootTimeout"
	FailureRepairTimeout       = "RepairTimeout"
	FailureUpdateTimeout       = "UpdateTimeout"
	// FailureInstanceTaken: spec.providerID names an instance that belongs
	// to another Machine, which is never adopted.
	FailureInstanceTaken = "InstanceTaken"
)

// Reasons of a Machine's Drifted condition.
const (
	// ReasonTemplateChanged: the Machine's spec differs from its template.
	ReasonTemplateChanged = "TemplateChanged"
	// ReasonUpToDate: the Machine's spec is its template's.
	ReasonUpToDate = "UpToDate"
)

// Reasons of a Machine's Drained condition.
const (
	// ReasonPreDrainHook: pre-drain hook annotations hold the drain.
	ReasonPreDrainHook = "PreDrainHook"
	// ReasonDraining: evicted pods are still terminating.
	ReasonDraining = "Draining"
	// ReasonPodDisruptionBudget: a PodDisruptionBudget refuses an
	// eviction.
	ReasonPodDisruptionBudget = "DisruptionBudget"
	// ReasonDrainRuleInvalid: a MachineDrainRule that selects the
	// Machine cannot be read (a selector the label library refuses);
	// nothing is evicted until it is fixed.
	ReasonDrainRuleInvalid = "DrainRuleInvalid"
	// ReasonWaitCompleted: every pod to evict is gone; pods the drain
	// waits for (behavior WaitCompleted) have not completed yet.
	ReasonWaitCompleted = "WaitCompleted"
	// ReasonDrainTimeout: the drain's timeout passed; what follows went
	// ahead anyway.
	ReasonDrainTimeout = "DrainTimeout"
	// ReasonDrained: every pod a drain evicts is gone.
	ReasonDrained = "Drained"
)

// Transition records one move of the lifecycle state machine.
type Transition struct {
	// From is the phase the Machine left.
	From MachinePhase `json:"from"`
	// To is the phase the Machine entered.
	To MachinePhase `json:"to"`
	// Event is the state machine event that moved it.
	Event string `json:"event"`
	// Time is when it moved.
	Time metav1.Time `json:"time"`
}

// OperationType is a verb carried out on a running Machine.
// +kubebuilder:validation:Enum=Reboot;Repair;Update
type OperationType string

// The operations a Machine can be asked to perform.
const (
	// OperationReboot restarts the instance; the Node's boot ID changes.
	OperationReboot OperationType = "Reboot"
	// OperationRepair re-images the instance.
	OperationRepair OperationType = "Repair"
	// OperationUpdate changes the instance in place to the Machine's
	// spec.version: the controller records it when the version changes.
	OperationUpdate OperationType = "Update"
)

// OperationState is how far an operation has come.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type OperationState string

// The states of an operation.
const (
	// OperationPending: recorded, not started.
	OperationPending OperationState = "Pending"
	// OperationRunning: the controller is carrying it out.
	OperationRunning OperationState = "Running"
	// OperationSucceeded: done.
	OperationSucceeded OperationState = "Succeeded"
	// OperationFailed: given up; Message says why.
	OperationFailed OperationState = "Failed"
)

// Operation is a verb requested on a Machine, recorded durably so that a
// restarted controller resumes it and never repeats a finished one.
type Operation struct {
	// Type is the verb.
	Type OperationType `json:"type"`
	// ID identifies this request; it is returned to the caller.
	// +kubebuilder:validation:MaxLength=64
	ID string `json:"id"`
	// State is how far the operation has come.
	State OperationState `json:"state"`
	// RequestedBy is the user who asked for it.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	RequestedBy string `json:"requestedBy,omitempty"`
	// RequestedAt is when it was asked for.
	// +optional
	RequestedAt *metav1.Time `json:"requestedAt,omitempty"`
	// StartedAt is when the controller began it.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// CompletedAt is when it succeeded or failed.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// Message says what happened, especially why it failed.
	// +kubebuilder:validation:MaxLength=32768
	// +optional
	Message string `json:"message,omitempty"`
	// Reason is why a Pending operation waits, in one word that clients
	// may match: DisruptionHeld while a MachineDisruptionBudget does not
	// allow it yet (Message then says which budget and why). Empty
	// otherwise.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Reason string `json:"reason,omitempty"`
	// Options are the request's options, as given.
	// +optional
	Options *OperationOptions `json:"options,omitempty"`
	// BootID is the Machine's boot ID when the operation was requested.
	// The operation is done once the Node reports another: recorded with
	// the request, it survives a controller that called the provider but
	// could not store what it did, and then sees the new boot already.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// ProviderBootID is the boot ID the provider reported for the new
	// boot when the operation was completed on its word, its Node not
	// seen because the Machine's cluster could not be reached. The
	// Node's boot ID is checked against it once the cluster answers
	// (condition BootConfirmed).
	// +optional
	ProviderBootID string `json:"providerBootID,omitempty"`
	// Source is how the request arrived: API (the verbs server),
	// Annotation (machinist.dev/request), HealthCheck (a
	// MachineHealthCheck's remediation) or Spec (a change of the Machine's
	// spec, for an Update).
	// +kubebuilder:validation:Enum=API;Annotation;HealthCheck;Spec
	// +optional
	Source OperationSource `json:"source,omitempty"`
	// FromVersion is the version the Node ran when an Update was
	// recorded.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	FromVersion string `json:"fromVersion,omitempty"`
	// ToVersion is the version an Update brings the Machine to: its
	// spec.version then. The Update is done when the Node reports it.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ToVersion string `json:"toVersion,omitempty"`
}

// OperationSource is how an operation was requested.
type OperationSource string

// The ways an operation can be requested.
const (
	// SourceAPI: through the verbs server's reboot or repair subresource.
	SourceAPI OperationSource = "API"
	// SourceAnnotation: through the machinist.dev/request annotation.
	SourceAnnotation OperationSource = "Annotation"
	// SourceHealthCheck: by a MachineHealthCheck's remediation ladder;
	// RequestedBy names it as machinehealthcheck/<name>.
	SourceHealthCheck OperationSource = "HealthCheck"
	// SourceSpec: by the Machine controller, because the Machine's spec
	// changed (an Update to a new spec.version).
	SourceSpec OperationSource = "Spec"
)

// OperationOptions are the options a verb was requested with.
type OperationOptions struct {
	// Mode is the reboot mode: Soft or Hard.
	// +optional
	Mode RebootMode `json:"mode,omitempty"`
	// SkipDrain is true when the Machine is not to be drained first (a
	// reboot or a repair; an update always drains).
	// +optional
	SkipDrain *bool `json:"skipDrain,omitempty"`
	// GracePeriodSeconds overrides pods' termination grace period during
	// the drain.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// Reason says why a repair was asked for.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Reason string `json:"reason,omitempty"`
	// TimeoutSeconds bounds the operation from its start: a drain still
	// going gives up, and a Machine not back Ready with a new boot ID is
	// Failed. Unset leaves the controller's own operation timeout.
	// +kubebuilder:validation:Minimum=1
	// +optional
	TimeoutSeconds *int64 `json:"timeoutSeconds,omitempty"`
	// OverrideDisruptionBudgets starts the operation even where a
	// MachineDisruptionBudget would refuse it; the verbs server sets it
	// only for a requester allowed to override budgets.
	// +optional
	OverrideDisruptionBudgets bool `json:"overrideDisruptionBudgets,omitempty"`
}

// MachineStatus is what the Machine controller observed and did.
type MachineStatus struct {
	// Phase is the Machine's lifecycle state.
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`

	// NodeRef names the Node this Machine became.
	// +optional
	NodeRef *NodeReference `json:"nodeRef,omitempty"`

	// ProviderID is the instance the provider created or adopted.
	// +optional
	ProviderID string `json:"providerID,omitempty"`

	// BootID is the Node's boot ID when last seen; a reboot changes it.
	// +optional
	BootID string `json:"bootID,omitempty"`

	// NodeInfo is what the Node reported about itself when last seen.
	// +optional
	NodeInfo *NodeInfo `json:"nodeInfo,omitempty"`

	// LastTransition is the state machine's most recent move.
	// +optional
	LastTransition *Transition `json:"lastTransition,omitempty"`

	// Operation is the verb in progress, or the last one finished.
	// +optional
	Operation *Operation `json:"operation,omitempty"`

	// Conditions report details of the Machine's state, such as Ready,
	// NodeHealthy and Drained.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// ErrorCount is how many provider calls in a row failed with a
	// transient error; the retry backoff grows with it. A transition resets it.
	// +optional
	ErrorCount int32 `json:"errorCount,omitempty"`

	// Remediation is where the Machine stands on its MachineHealthCheck's
	// remediation ladder; only that health check writes it.
	// +optional
	Remediation *MachineRemediation `json:"remediation,omitempty"`
	// FailureMessage is, while the Machine is Failed, why: its Ready
	// condition's message. It is absent in every other phase. The
	// conditions say the same; this field is kept, under the name Cluster
	// API's Machine uses, for readers of that status, such as the
	// Kubernetes cluster-autoscaler, which counts a Machine with a
	// failureMessage as failed and backs off its node group at once
	// instead of waiting for the Machine's Node.
	// +kubebuilder:validation:MaxLength=32768
	// +optional
	FailureMessage string `json:"failureMessage,omitempty"`

	// KeptToken records the bootstrap token the manager keeps for this
	// Machine's machine, repaired while its cluster could not be reached,
	// until that cluster answers and is given it. Only the manager writes
	// it (status is not a tenant's to write), so a Secret under the kept
	// token's name that this does not record was not made by the manager
	// and is never used.
	// +optional
	KeptToken *KeptToken `json:"keptToken,omitempty"`
}

// KeptToken is the Secret the manager keeps a bootstrap token in, beside
// the Machine, while the Machine's cluster cannot be given it.
type KeptToken struct {
	// SecretUID is the UID kube-apiserver gave the Secret the manager
	// made. Whoever else makes a Secret of the same name, even after
	// deleting the manager's, makes one with another UID.
	// +kubebuilder:validation:MaxLength=128
	// +required
	SecretUID string `json:"secretUID"`
	// TokenID is the public half of the token, the ID its Secret in the
	// cluster is named by once published.
	// +kubebuilder:validation:MaxLength=6
	// +required
	TokenID string `json:"tokenID"`
	// Published is true once the cluster holds the token: what is left is
	// to delete it, and its Secret here, once the machine has joined.
	// +optional
	Published bool `json:"published,omitempty"`
}

// Failure is why a Failed Machine failed, as its Ready condition says: a
// machine-readable reason and a message for people. Both are empty unless
// the Machine is Failed.
func (s *MachineStatus) Failure() (reason, message string) {
	if s.Phase != MachineFailed {
		return "", ""
	}
	if c := meta.FindStatusCondition(s.Conditions, ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		return c.Reason, c.Message
	}
	return "", ""
}

// SetFailureMessage makes FailureMessage say what Failure does: why the
// Machine is Failed, and nothing in any other phase. A Failed Machine's
// message is never empty, since an empty one would not say it failed.
func (s *MachineStatus) SetFailureMessage() {
	reason, message := s.Failure()
	switch {
	case s.Phase != MachineFailed:
		s.FailureMessage = ""
	case message != "":
		s.FailureMessage = message
	case reason != "":
		s.FailureMessage = reason
	default:
		s.FailureMessage = "the Machine failed"
	}
}

// The bounds of the free-text strings of a Machine's status: a
// condition's message (metav1.Condition's own bound), an operation's
// message and who requested it.
const (
	MaxMessageLength     = 32768
	MaxRequestedByLength = 1024
)

// Fit cuts what the status holds of free text (condition messages, the
// operation's message and requestedBy) to the schema's bounds, ending
// each string it cuts in "...". Providers, nodes and users say what they
// say; a status write past a bound would be refused, and the Machine's
// every write after it, for ever.
func (s *MachineStatus) Fit() {
	s.FailureMessage = Shorten(s.FailureMessage, MaxMessageLength)
	for i := range s.Conditions {
		s.Conditions[i].Message = Shorten(s.Conditions[i].Message, MaxMessageLength)
	}
	if op := s.Operation; op != nil {
		op.Message = Shorten(op.Message, MaxMessageLength)
		op.RequestedBy = Shorten(op.RequestedBy, MaxRequestedByLength)
	}
}

// Shorten cuts s to at most n bytes, ending in "...", without splitting
// a UTF-8 sequence: for free text put into a bounded field.
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// Machine is one machine (and so one Node), driven through its lifecycle
// by the Machine controller.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=ma,categories=machinist
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeRef.name`
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="ProviderID",type=string,JSONPath=`.status.providerID`,priority=1
// +kubebuilder:printcolumn:name="Drifted",type=string,JSONPath=`.status.conditions[?(@.type=="Drifted")].status`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// The clusterName rule sits here, not on MachineSpec, because a
	// template embeds MachineSpec and may change its clusterName. It is on
	// spec, not on clusterName, because a rule on a field is not run when
	// the field is added or removed, and both are changes of cluster.

	// +kubebuilder:validation:XValidation:rule="(has(self.clusterName) ? self.clusterName : '') == (has(oldSelf.clusterName) ? oldSelf.clusterName : '')",fieldPath=".clusterName",message="clusterName cannot be set, changed or removed once the Machine exists: a Machine serves one cluster for life; make a new Machine in the other cluster"
	// +required
	Spec MachineSpec `json:"spec"`
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// MachineList is a list of Machines.
//
// +kubebuilder:object:root=true
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Machine `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Machine{}, &MachineList{})
}

// NodeInfoOf is what a Machine records of its Node's system info.
func NodeInfoOf(in corev1.NodeSystemInfo) *NodeInfo {
	return &NodeInfo{
		MachineID: in.MachineID, SystemUUID: in.SystemUUID, BootID: in.BootID,
		KernelVersion: in.KernelVersion, OSImage: in.OSImage,
		ContainerRuntimeVersion: in.ContainerRuntimeVersion, KubeletVersion: in.KubeletVersion,
		OperatingSystem: in.OperatingSystem, Architecture: in.Architecture,
	}
}
