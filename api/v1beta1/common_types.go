package v1beta1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DrainSettings says how a Machine's Node is drained before the Machine is
// rebooted, repaired or deleted. A Machine's settings override its class's,
// field by field.
type DrainSettings struct {
	// Timeout bounds the whole drain. When it passes the Machine goes on
	// (a deletion deletes anyway) and its Drained condition says so. Unset or
	// zero means no limit: a drain waits as long as a budget refuses.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="drain timeout must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// GracePeriodSeconds overrides each evicted pod's own termination grace
	// period. Unset keeps the pod's own.
	// +kubebuilder:validation:XValidation:rule="self >= 0 && self <= 86400",message="drain gracePeriodSeconds must be from 0 to 86400 (a day)"
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`

	// VolumeDetachTimeout bounds the wait, after the drain of a Machine
	// being deleted or repaired, for the VolumeAttachments that name its
	// Node to go. When it passes the Machine goes on with an Event saying
	// so. Unset or zero means no limit: an instance is never deleted or
	// re-imaged under an attached volume.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="drain volumeDetachTimeout must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +optional
	VolumeDetachTimeout *metav1.Duration `json:"volumeDetachTimeout,omitempty"`

	// NodeDeletionTimeout bounds how long the deletion of a deleted
	// Machine's Node is tried, once its instance is gone, before it is
	// given up with an Event and the Machine goes. Unset means 10s; zero
	// means no limit.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="drain nodeDeletionTimeout must be a duration such as 10s, 5m or 1h30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +optional
	NodeDeletionTimeout *metav1.Duration `json:"nodeDeletionTimeout,omitempty"`
}

// DefaultNodeDeletionTimeout is how long a Node's deletion is tried when
// no drain settings say.
const DefaultNodeDeletionTimeout = 10 * time.Second

// NodeTaints is a list of taints for a Node, validated so that a typo in an
// effect is caught when the object is written, not when the Node is tainted.
// A key and an effect name one taint, as on a Node.
// +kubebuilder:validation:MaxItems=64
// +listType=map
// +listMapKey=key
// +listMapKey=effect
type NodeTaints []Taint

// Taint is a taint a Node is given. Unlike corev1.Taint it has no
// timeAdded, which only the Node's own controller sets.
type Taint struct {
	// Key is the taint's key.
	// +kubebuilder:validation:XValidation:rule="size(self) > 0",message="every taint needs a key"
	// +kubebuilder:validation:MaxLength=317
	// +required
	Key string `json:"key"`

	// Value is the taint's value.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Value string `json:"value,omitempty"`

	// Effect is NoSchedule, PreferNoSchedule or NoExecute.
	// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute
	// +required
	Effect corev1.TaintEffect `json:"effect"`
}

// NodeLabels are labels for a Node. They are bounded here, so that a
// mistake is refused where it is written rather than when the Node is.
// +kubebuilder:validation:MaxProperties=64
// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="a node label's key is at most 317 characters (a 253-character prefix, '/', and a 63-character name) and its value at most 63"
type NodeLabels map[string]string

// RebootMode is how a Machine is rebooted.
// +kubebuilder:validation:Enum=Soft;Hard
type RebootMode string

// The reboot modes.
const (
	// RebootSoft asks the machine's operating system to restart.
	RebootSoft RebootMode = "Soft"
	// RebootHard resets the machine, as its power button would.
	RebootHard RebootMode = "Hard"
)

// Condition types and reasons shared by the kinds in this package.
const (
	// ConditionReady is True when the object has reached what its spec asks.
	ConditionReady = "Ready"
)

// ReasonDisruptionHeld says that a MachineDisruptionBudget holds something
// back, which goes on by itself once the budget allows: the reason of a
// Pending operation (status.operation.reason), of a MachineSet's Ready
// condition while a deletion its rollout asked for waits, of its
// MachineDeployment's Progressing condition meanwhile or while an InPlace
// rollout's update waits, and of the Events that say so.
const ReasonDisruptionHeld = "DisruptionHeld"

// AsCore is the taint as a Node carries it.
func (t Taint) AsCore() corev1.Taint {
	return corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect}
}

// PausedAnnotation, set on any Machinist object, stops every controller
// from acting on it until it is removed: for a move to another management
// cluster, a restore, or a person's own work on it. On a WorkloadCluster it
// pauses every Machine of the cluster too. Any value pauses but "false".
const PausedAnnotation = "machinist.dev/paused"

// ConditionPaused is True while PausedAnnotation keeps the controllers off
// the object, and False, reason ReasonNotPaused, once it no longer does. An
// object never paused carries no Paused condition: a settled fleet is not
// written for it.
const ConditionPaused = "Paused"

// Reasons of the Paused condition, besides ReasonPaused (the annotation
// is on the object itself).
const (
	// ReasonClusterPaused: PausedAnnotation is on the Machine's
	// WorkloadCluster.
	ReasonClusterPaused = "ClusterPaused"
	// ReasonNotPaused: the object was paused and is not any more.
	ReasonNotPaused = "NotPaused"
)
