package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// StrategyType is how a MachineDeployment replaces old Machines.
// +kubebuilder:validation:Enum=RollingUpdate;Recreate;OnDelete;InPlace
type StrategyType string

// The rollout strategies.
const (
	// RollingUpdateStrategy replaces Machines a few at a time, bounded by
	// maxSurge and maxUnavailable.
	RollingUpdateStrategy StrategyType = "RollingUpdate"
	// RecreateStrategy removes every old Machine before creating new ones.
	RecreateStrategy StrategyType = "Recreate"
	// OnDeleteStrategy replaces an old Machine only after someone deletes it.
	OnDeleteStrategy StrategyType = "OnDelete"
	// InPlaceStrategy updates Machines where they stand, a few at a time,
	// bounded by inPlace.maxUnavailable: the same Machines and Nodes, a new
	// version.
	InPlaceStrategy StrategyType = "InPlace"
)

// InPlaceFallback is what an InPlace rollout does with a change its
// provider cannot apply in place.
// +kubebuilder:validation:Enum=Never;Replace
type InPlaceFallback string

// The fallbacks of an InPlace rollout.
const (
	// FallbackNever replaces nothing: the rollout stops and says why in
	// its Progressing condition.
	FallbackNever InPlaceFallback = "Never"
	// FallbackReplace replaces the Machines as a RollingUpdate with
	// maxSurge 0 and the in-place maxUnavailable would.
	FallbackReplace InPlaceFallback = "Replace"
)

// RolloutPhase is where a MachineDeployment's rollout stands.
type RolloutPhase string

// The rollout phases.
const (
	// RolloutStable: every Machine matches the current template.
	RolloutStable RolloutPhase = "Stable"
	// RolloutProgressing: old Machines are being replaced.
	RolloutProgressing RolloutPhase = "Progressing"
	// RolloutPaused: spec.paused froze the rollout.
	RolloutPaused RolloutPhase = "Paused"
	// RolloutStalled: no progress within progressDeadlineSeconds.
	RolloutStalled RolloutPhase = "Stalled"
)

// Condition types of a MachineDeployment.
const (
	// ConditionProgressing says how the rollout goes: True while it runs
	// or is complete, Unknown while it is paused, False when it is stuck;
	// its reason says which.
	ConditionProgressing = "Progressing"
	// ConditionAvailable is True while at least spec.replicas minus
	// maxUnavailable Machines are available.
	ConditionAvailable = "Available"
)

// Reasons of a MachineDeployment's conditions. While a disruption budget
// holds the rollout back, Progressing has reason ReasonDisruptionHeld.
const (
	// ReasonRollingOut: Progressing is True, old Machines are being
	// replaced.
	ReasonRollingOut = "RollingOut"
	// ReasonNewMachineSetAvailable: Progressing is True, the rollout is
	// complete and the current template's MachineSet has every Machine
	// available.
	ReasonNewMachineSetAvailable = "NewMachineSetAvailable"
	// ReasonPaused: Progressing is Unknown, spec.paused is set; or, of
	// any kind's Paused condition, PausedAnnotation is on the object.
	ReasonPaused = "Paused"
	// ReasonProgressDeadlineExceeded: Progressing is False, the rollout
	// made no progress for progressDeadlineSeconds.
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	// ReasonInPlaceNotPossible: Progressing is False, an InPlace rollout
	// with fallback Never has a change its provider cannot apply in
	// place; the message names the set and the change.
	ReasonInPlaceNotPossible = "InPlaceNotPossible"
	// ReasonMinimumAvailable: Available is True.
	ReasonMinimumAvailable = "MinimumAvailable"
	// ReasonBelowMinimum: Available is False, fewer Machines are available
	// than maxUnavailable allows.
	ReasonBelowMinimum = "BelowMinimum"
)

// Labels and annotations of MachineDeployments and their MachineSets.
const (
	// TemplateHashLabel is on a MachineDeployment's MachineSets and their
	// Machines: a hash of the template they were made from.
	TemplateHashLabel = "machinist.dev/template-hash"
	// RevisionAnnotation numbers the templates a MachineDeployment has
	// rolled out; the MachineSet of the current template has the highest.
	RevisionAnnotation = "machinist.dev/revision"
	// ChangeCauseAnnotation on a MachineDeployment says why its template
	// changed, as on a Deployment; the MachineSet of that template keeps
	// it, and `kubectl machine rollout history` shows it.
	ChangeCauseAnnotation = "kubernetes.io/change-cause"
	// DesiredReplicasAnnotation is the deployment's spec.replicas when a
	// MachineSet was last sized, so that a change of it is noticed and
	// spread over the sets in proportion.
	DesiredReplicasAnnotation = "machinist.dev/desired-replicas"
	// RollingOutAnnotation marks a MachineSet a MachineDeployment's
	// rollout is emptying (an old revision): the set deletes each of its
	// Machines only once the MachineDisruptionBudgets admit it, as a
	// disruption of reason Rollout. Its value names the MachineDeployment.
	RollingOutAnnotation = "machinist.dev/rolling-out"
	// DeploymentNameLabel and DeploymentRevisionAnnotation repeat, under
	// Cluster API's own keys, a MachineSet's MachineDeployment and
	// RevisionAnnotation. The Kubernetes cluster-autoscaler reads these
	// keys whatever the API group, and scales no Node of a
	// MachineDeployment down while a set older than the newest revision
	// still has Machines: a rollout decides which Machines go then.
	DeploymentNameLabel          = "cluster.x-k8s.io/deployment-name"
	DeploymentRevisionAnnotation = "machinedeployment.clusters.x-k8s.io/revision"
	// ReleasingAnnotation on a MachineSet lists, comma-separated, the
	// names of Machines it owns but is handing over to another set: it
	// neither counts them toward spec.replicas nor deletes them. Written
	// with the set's lowered replicas in one update, it keeps the set from
	// replacing a Machine that is leaving it.
	ReleasingAnnotation = "machinist.dev/releasing"
	// ReceivingAnnotation on a MachineSet lists, comma-separated, the
	// names of Machines another set is handing over to it: it counts them
	// toward spec.replicas before it owns them (never deleting one it does
	// not own), so that it creates none in their place.
	ReceivingAnnotation = "machinist.dev/receiving"
)

// MachineDeploymentStrategy is how a template change is rolled out.
// +kubebuilder:validation:XValidation:rule="!has(self.rollingUpdate) || !has(self.type) || self.type == 'RollingUpdate'",message="rollingUpdate may only be set when the strategy type is RollingUpdate"
// +kubebuilder:validation:XValidation:rule="!has(self.inPlace) || (has(self.type) && self.type == 'InPlace')",message="inPlace may only be set when the strategy type is InPlace"
type MachineDeploymentStrategy struct {
	// Type is RollingUpdate, Recreate, OnDelete or InPlace.
	// +kubebuilder:default=RollingUpdate
	// +optional
	Type StrategyType `json:"type,omitempty"`

	// RollingUpdate bounds a RollingUpdate. Unset means maxSurge 1 and
	// maxUnavailable 0: never fewer Machines than asked for.
	// +optional
	RollingUpdate *RollingUpdate `json:"rollingUpdate,omitempty"`

	// InPlace bounds an InPlace rollout. Unset means maxUnavailable 1 and
	// fallback Never.
	// +optional
	InPlace *InPlaceUpdate `json:"inPlace,omitempty"`
}

// InPlaceUpdate bounds an InPlace rollout.
type InPlaceUpdate struct {
	// MaxUnavailable is how many Machines may be unavailable below
	// spec.replicas while they are updated: a count, 1 or more, or a
	// percentage of spec.replicas, rounded down but never below one.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 && self <= 100000 : self.matches('^(100|[1-9][0-9]?)%$')",message="maxUnavailable must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%: an in-place rollout takes each Machine out of service while it is updated"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// Fallback is what happens to a change the provider cannot apply in
	// place, such as another MachineClass: Never stops the rollout and says
	// so in the Progressing condition; Replace replaces the Machines as a
	// RollingUpdate with maxSurge 0 and this maxUnavailable would.
	// +kubebuilder:default=Never
	// +optional
	Fallback InPlaceFallback `json:"fallback,omitempty"`
}

// RollingUpdate bounds how far a rollout may stray from spec.replicas.
// Percentages are of spec.replicas; maxSurge rounds up and maxUnavailable
// rounds down, as Deployments do.
// +kubebuilder:validation:XValidation:rule="!(has(self.maxSurge) && has(self.maxUnavailable) && (type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge == '0%') && (type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable == '0%'))",message="maxSurge and maxUnavailable cannot both be zero: the rollout could never replace a Machine"
type RollingUpdate struct {
	// MaxSurge is how many Machines may exist above spec.replicas.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 100000 : self.matches('^(0|[1-9][0-9]?|100)%$')",message="maxSurge must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%"
	// +optional
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// MaxUnavailable is how many Machines may be unavailable below
	// spec.replicas.
	// +kubebuilder:default=0
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 100000 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// MachineDeploymentSpec is the Machines a deployment should run and how
// changes to them roll out.
// +kubebuilder:validation:XValidation:rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="selector must not be empty: an empty selector would claim every Machine in the namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.template.metadata) && has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])",message="selector does not match the template's labels: every Machine made from the template must be selected by the selector"
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchExpressions) || self.selector.matchExpressions.all(e, e.operator == 'In' ? (has(self.template.metadata) && has(self.template.metadata.labels) && e.key in self.template.metadata.labels && has(e.values) && self.template.metadata.labels[e.key] in e.values) : e.operator == 'NotIn' ? (!has(self.template.metadata) || !has(self.template.metadata.labels) || !(e.key in self.template.metadata.labels) || !has(e.values) || !(self.template.metadata.labels[e.key] in e.values)) : e.operator == 'Exists' ? (has(self.template.metadata) && has(self.template.metadata.labels) && e.key in self.template.metadata.labels) : (!has(self.template.metadata) || !has(self.template.metadata.labels) || !(e.key in self.template.metadata.labels)))",message="selector's matchExpressions do not match the template's labels: every Machine made from the template must be selected by the selector"
// +kubebuilder:validation:XValidation:rule="!has(self.progressDeadlineSeconds) || self.progressDeadlineSeconds <= 0 || self.progressDeadlineSeconds > (has(self.minReadySeconds) ? self.minReadySeconds : 0)",message="progressDeadlineSeconds must be greater than minReadySeconds, or every rollout would stall before a new Machine could count as available"
type MachineDeploymentSpec struct {
	// Replicas is how many Machines should run.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="replicas must be zero or more"
	// +kubebuilder:validation:XValidation:rule="self <= 100000",message="replicas must be at most 100000: a larger number is more likely a typo than a fleet"
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Selector picks the Machines (through their MachineSets) this
	// deployment owns. It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="selector is immutable: create a new MachineDeployment to select other Machines"
	// +required
	Selector LabelSelector `json:"selector"`

	// Template is the Machine to run; changing it starts a rollout.
	// +required
	Template MachineTemplateSpec `json:"template"`

	// Strategy is how template changes replace old Machines.
	// +kubebuilder:default={type: RollingUpdate}
	// +optional
	Strategy MachineDeploymentStrategy `json:"strategy,omitempty"`

	// MinReadySeconds is how long a new Machine must be Ready before it
	// counts as available.
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="minReadySeconds must be zero or more"
	// +kubebuilder:validation:XValidation:rule="self <= 3600",message="minReadySeconds must be at most 3600 (an hour)"
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`

	// RevisionHistoryLimit is how many old, empty MachineSets are kept for
	// rollback.
	// +kubebuilder:default=10
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="revisionHistoryLimit must be zero or more"
	// +kubebuilder:validation:XValidation:rule="self <= 100",message="revisionHistoryLimit must be at most 100"
	// +optional
	RevisionHistoryLimit *int32 `json:"revisionHistoryLimit,omitempty"`

	// Paused freezes the rollout; scaling still happens.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// ProgressDeadlineSeconds is how long a rollout may make no progress
	// before it is reported Stalled.
	// +kubebuilder:default=600
	// +kubebuilder:validation:XValidation:rule="self > 0",message="progressDeadlineSeconds must be more than zero"
	// +kubebuilder:validation:XValidation:rule="self <= 86400",message="progressDeadlineSeconds must be at most 86400 (a day)"
	// +optional
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`

	// ExpireAfter is the longest a Machine of this deployment may live:
	// one older is replaced (deleted, and its MachineSet makes a new one),
	// one at a time for the deployment and within the
	// MachineDisruptionBudgets that select it (reason Expiry). Unset:
	// Machines live until something else replaces them.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1s')",message="expireAfter must be a duration of at least 1s, such as 720h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +optional
	ExpireAfter *metav1.Duration `json:"expireAfter,omitempty"`
}

// MachineDeploymentStatus is what the MachineDeployment controller observed.
type MachineDeploymentStatus struct {
	// Replicas is how many Machines the deployment owns, old and new.
	// +optional
	Replicas int32 `json:"replicas"`

	// UpdatedReplicas is how many match the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`

	// ReadyReplicas is how many have a Ready Node.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// AvailableReplicas is how many have been Ready for minReadySeconds.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas,omitempty"`

	// UnavailableReplicas is how many more must become available to reach
	// spec.replicas.
	// +optional
	UnavailableReplicas int32 `json:"unavailableReplicas,omitempty"`

	// Selector is spec.selector as a string, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Phase is where the rollout stands.
	// +optional
	Phase RolloutPhase `json:"phase,omitempty"`

	// LastProgressTime is when the rollout last made progress: a Machine of
	// the current template created or becoming available, or an old one
	// removed. progressDeadlineSeconds counts from it.
	// +optional
	LastProgressTime *metav1.Time `json:"lastProgressTime,omitempty"`

	// ObservedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions report the deployment's state, such as Available and
	// Progressing.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineDeployment rolls a Machine template out through MachineSets.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=md,categories=machinist
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedReplicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineDeploymentSpec `json:"spec"`
	// +optional
	Status MachineDeploymentStatus `json:"status,omitempty"`
}

// MachineDeploymentList is a list of MachineDeployments.
//
// +kubebuilder:object:root=true
type MachineDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineDeployment `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineDeployment{}, &MachineDeploymentList{})
}
