package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineHealthCheckSpec says which Machines are checked, what makes one
// unhealthy and how an unhealthy one is brought back.
type MachineHealthCheckSpec struct {
	// Selector picks the Machines this health check watches over, in its
	// own namespace. It cannot be empty.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selector must not be empty: an empty selector would pick every Machine in the namespace; to mean every Machine, say so with a matchExpressions entry they all meet"
	// +required
	Selector LabelSelector `json:"selector"`

	// NodeStartupTimeout is how long a Machine may go without a Ready Node
	// after its provisioning started before it is unhealthy. Zero turns the
	// check off.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="nodeStartupTimeout must be a duration such as 90s, 10m or 1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="10m"
	// +optional
	NodeStartupTimeout *metav1.Duration `json:"nodeStartupTimeout,omitempty"`

	// UnhealthyNodeConditions make a Machine unhealthy when its Node has
	// held one of them for at least its timeout. A Running Machine whose
	// Node is gone and a Failed Machine are unhealthy whatever this says.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:default={{type: "Ready", status: "Unknown", timeout: "60s"},{type: "Ready", status: "False", timeout: "60s"}}
	// An empty list turns these checks off; unset takes the default.
	// +listType=atomic
	// +optional
	UnhealthyNodeConditions []UnhealthyNodeCondition `json:"unhealthyNodeConditions"`

	// Remediation is how an unhealthy Machine is brought back, and how
	// many at once.
	// +kubebuilder:default={}
	// +optional
	Remediation Remediation `json:"remediation,omitempty"`

	// MaxUnhealthy short-circuits remediation: while more of the selected
	// Machines than this are unhealthy, no new remediation starts, because
	// so many failing at once points at something no reboot fixes (a zone
	// outage, a partitioned control plane). A count or a percentage of the
	// selected Machines, rounded down.
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 100000 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnhealthy must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default="100%"
	// +optional
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
}

// UnhealthyNodeCondition is a Node condition that, held for Timeout,
// makes its Machine unhealthy.
type UnhealthyNodeCondition struct {
	// Type of the Node condition, such as Ready or a node problem
	// detector's KernelDeadlock.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type string `json:"type"`

	// Status the condition must have: True, False or Unknown.
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status string `json:"status"`

	// Timeout is how long the condition must have held; more than zero, as
	// a condition counts only once it has held for a while.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="a condition's timeout must be a duration such as 60s or 5m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$') || duration(self) > duration('0s')",message="a condition's timeout must be more than 0s: a condition makes a Machine unhealthy only once it has held for a while, such as 60s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	Timeout metav1.Duration `json:"timeout"`
}

// RemediationAction is what one rung of the ladder does.
// +kubebuilder:validation:Enum=Reboot;Repair;Replace
type RemediationAction string

// The actions of a remediation ladder.
const (
	// RemediateReboot reboots the Machine, as `kubectl machine reboot` does.
	RemediateReboot RemediationAction = "Reboot"
	// RemediateRepair re-images the Machine, as `kubectl machine repair` does.
	RemediateRepair RemediationAction = "Repair"
	// RemediateReplace deletes the Machine so that its MachineSet makes a
	// new one. A Machine no MachineSet owns is never replaced.
	RemediateReplace RemediationAction = "Replace"
)

// Remediation is the ladder an unhealthy Machine climbs and the limits on
// how many climb it at once.
type Remediation struct {
	// Ladder lists what is tried, in order: each rung that does not bring
	// the Machine back healthy within its timeout, or whose operation
	// fails, hands over to the next. A rung the Machine cannot take (a
	// Failed Machine cannot reboot) is skipped, with an Event saying why.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="!self.exists(r, r.action == 'Replace') || (self[size(self) - 1].action == 'Replace' && self.exists_one(r, r.action == 'Replace'))",message="Replace must be the last rung, and only one: nothing can follow a Machine that was deleted"
	// +kubebuilder:default={{action: "Reboot", timeout: "5m"},{action: "Repair", timeout: "15m"},{action: "Replace"}}
	// +listType=atomic
	// +optional
	Ladder []Rung `json:"ladder,omitempty"`

	// MaxInFlight bounds the Machines being remediated at once: a count,
	// or a percentage of the selected Machines rounded up.
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 && self <= 100000 : self.matches('^(100|[1-9][0-9]?)%$')",message="maxInFlight must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default=1
	// +optional
	MaxInFlight *intstr.IntOrString `json:"maxInFlight,omitempty"`

	// Cooldown is how long a remediated Machine is remembered: one that
	// falls unhealthy again within it starts on the rung after the one that
	// last healed it, not on the first. 0s turns the memory off.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$')",message="cooldown must be a duration such as 30m or 1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="30m"
	// +optional
	Cooldown *metav1.Duration `json:"cooldown,omitempty"`
}

// Rung is one step of a remediation ladder.
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.action == 'Reboot'",message="mode applies only to a Reboot rung"
// +kubebuilder:validation:XValidation:rule="self.action == 'Replace' || has(self.timeout)",message="a Reboot or Repair rung needs a timeout: how long it may take to bring the Machine back healthy"
// +kubebuilder:validation:XValidation:rule="self.action != 'Replace' || !has(self.timeout)",message="a Replace rung takes no timeout: the Machine is deleted and its MachineSet makes a new one"
type Rung struct {
	// Action is what this rung does.
	Action RemediationAction `json:"action"`

	// Mode is the reboot mode, Soft or Hard; Soft when unset. A Machine
	// whose Node is unreachable is always rebooted hard and without a
	// drain: nothing on it can answer a soft reboot or finish an eviction.
	// +optional
	Mode RebootMode `json:"mode,omitempty"`

	// Timeout is how long a Reboot or Repair rung may take to bring the
	// Machine back healthy, from when it starts; after that the next rung
	// starts. It is also the operation's timeoutSeconds.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1s')",message="a rung's timeout must be a duration of at least 1s, such as 5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// MachineHealthCheckStatus is what the health check last observed.
type MachineHealthCheckStatus struct {
	// ExpectedMachines is how many Machines the selector picks, not
	// counting those being deleted.
	// +optional
	ExpectedMachines int32 `json:"expectedMachines"`
	// HealthyMachines is how many of them pass every check.
	// +optional
	HealthyMachines int32 `json:"healthyMachines"`
	// UnhealthyMachines is how many of them fail a check.
	// +optional
	UnhealthyMachines int32 `json:"unhealthyMachines"`
	// RemediationsInFlight is how many Machines are on a rung now.
	// +optional
	RemediationsInFlight int32 `json:"remediationsInFlight"`
	// RemediationsAllowed is how many more may start now: zero while the
	// health check is short-circuited by maxUnhealthy.
	// +optional
	RemediationsAllowed int32 `json:"remediationsAllowed"`
	// ObservedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions report the health check's state; RemediationAllowed is
	// False while maxUnhealthy holds remediation back, ClustersReachable
	// False while Machines are not judged because their workload cluster
	// cannot be reached.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types and reasons of health checks.
const (
	// ConditionRemediationAllowed is a MachineHealthCheck's condition: False
	// while more Machines are unhealthy than maxUnhealthy allows.
	ConditionRemediationAllowed = "RemediationAllowed"
	// ConditionHealthCheckSucceeded is a Machine's condition: True while it
	// passes its health check's checks.
	ConditionHealthCheckSucceeded = "HealthCheckSucceeded"
	// ConditionRemediating is a Machine's condition: True while a rung of
	// its health check's ladder is in progress; its reason names the rung.
	ConditionRemediating = "Remediating"
	// ConditionClustersReachable is a MachineHealthCheck's condition, set
	// once one of its Machines was left unjudged because its workload
	// cluster could not be reached: False (reason ClusterUnreachable,
	// naming the clusters) while any is, True (reason Reachable) after.
	ConditionClustersReachable = "ClustersReachable"
	// ReasonReachable: the cluster of every selected Machine can
	// be reached.
	ReasonReachable = "Reachable"
)

// Reasons of a Machine's HealthCheckSucceeded condition.
const (
	// ReasonPassed: the Machine passes every check (or is still being
	// provisioned within nodeStartupTimeout).
	ReasonPassed = "Passed"
	// ReasonMachineFailed: the Machine is Failed.
	ReasonMachineFailed = "MachineFailed"
	// ReasonNodeStartupTimeout: no Node joined within nodeStartupTimeout.
	ReasonNodeStartupTimeout = "NodeStartupTimeout"
	// ReasonUnhealthyNodeCondition: a Node condition matched an unhealthy check for
	// longer than its timeout. (ReasonNodeNotFound, shared with the
	// NodeHealthy condition, says the Node is gone.)
	ReasonUnhealthyNodeCondition = "UnhealthyNodeCondition"
)

// Reasons of a MachineHealthCheck's RemediationAllowed condition.
const (
	// ReasonWithinLimits: unhealthy Machines are within maxUnhealthy.
	ReasonWithinLimits = "WithinLimits"
	// ReasonTooManyUnhealthy: more Machines are unhealthy than
	// maxUnhealthy allows; no remediation starts.
	ReasonTooManyUnhealthy = "TooManyUnhealthy"
	// ReasonInvalidSelector: the selector cannot be parsed.
	ReasonInvalidSelector = "InvalidSelector"
)

// RemediationPhase is where a Machine stands on its health check's ladder.
// The healthcheck package's state machine is the only thing that moves it.
// +kubebuilder:validation:Enum=Healthy;Unhealthy;Rebooting;Repairing;Replacing;Recovered;Exhausted
type RemediationPhase string

// The phases of a Machine's remediation.
const (
	// RemediationHealthy: the Machine passes its checks; no ladder is climbed.
	RemediationHealthy RemediationPhase = "Healthy"
	// RemediationUnhealthy: the Machine fails a check and waits for its
	// rung to start (a free slot under maxInFlight, maxUnhealthy, or an
	// operation someone else started).
	RemediationUnhealthy RemediationPhase = "Unhealthy"
	// RemediationRebooting: a Reboot rung is in progress.
	RemediationRebooting RemediationPhase = "Rebooting"
	// RemediationRepairing: a Repair rung is in progress.
	RemediationRepairing RemediationPhase = "Repairing"
	// RemediationReplacing: the Machine was deleted to be replaced.
	RemediationReplacing RemediationPhase = "Replacing"
	// RemediationRecovered: a rung brought the Machine back; it is
	// remembered for the cooldown.
	RemediationRecovered RemediationPhase = "Recovered"
	// RemediationExhausted: every rung was tried or skipped and the Machine
	// is still unhealthy; a person must look.
	RemediationExhausted RemediationPhase = "Exhausted"
)

// MachineRemediation is where a Machine stands on its health check's
// ladder, stored on the Machine so that a restarted manager resumes on the
// same rung.
type MachineRemediation struct {
	// HealthCheck names the MachineHealthCheck that remediates this Machine.
	HealthCheck string `json:"healthCheck"`
	// Phase is where the Machine stands on the ladder.
	Phase RemediationPhase `json:"phase"`
	// Rung is the index, from 0, of the rung in progress, or of the rung
	// that last healed the Machine once it has recovered.
	// +optional
	Rung int32 `json:"rung"`
	// Action is the rung's action, as it was when it started.
	// +optional
	Action RemediationAction `json:"action,omitempty"`
	// UnhealthySince is when the Machine was found unhealthy.
	// +optional
	UnhealthySince *metav1.Time `json:"unhealthySince,omitempty"`
	// RungStartedAt is when the rung in progress started.
	// +optional
	RungStartedAt *metav1.Time `json:"rungStartedAt,omitempty"`
	// OperationID is the reboot or repair the rung requested.
	// +optional
	OperationID string `json:"operationID,omitempty"`
	// RecoveredAt is when a rung last brought the Machine back; the
	// cooldown counts from it.
	// +optional
	RecoveredAt *metav1.Time `json:"recoveredAt,omitempty"`
	// Message says why the Machine is where it is.
	// +optional
	Message string `json:"message,omitempty"`
}

// MachineHealthCheck watches over a set of Machines and heals the unhealthy
// ones by a ladder of remediations: reboot, repair, replace.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=mhc,categories=machinist
// +kubebuilder:printcolumn:name="Expected",type=integer,JSONPath=`.status.expectedMachines`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyMachines`
// +kubebuilder:printcolumn:name="Unhealthy",type=integer,JSONPath=`.status.unhealthyMachines`
// +kubebuilder:printcolumn:name="In-Flight",type=integer,JSONPath=`.status.remediationsInFlight`
// +kubebuilder:printcolumn:name="Allowed",type=integer,JSONPath=`.status.remediationsAllowed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="RemediationAllowed")].reason`,priority=1
type MachineHealthCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineHealthCheckSpec `json:"spec"`
	// +optional
	Status MachineHealthCheckStatus `json:"status,omitempty"`
}

// MachineHealthCheckList is a list of MachineHealthChecks.
//
// +kubebuilder:object:root=true
type MachineHealthCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineHealthCheck `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineHealthCheck{}, &MachineHealthCheckList{})
}
