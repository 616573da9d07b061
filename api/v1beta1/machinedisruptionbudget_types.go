package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DisruptionReason is why a Machine is taken out of service on purpose.
// +kubebuilder:validation:Enum=Rollout;Update;Reboot;Repair;Remediation;Expiry
type DisruptionReason string

// The voluntary disruptions a MachineDisruptionBudget can limit.
const (
	// DisruptionRollout: a RollingUpdate or Recreate rollout replaces the
	// Machine.
	DisruptionRollout DisruptionReason = "Rollout"
	// DisruptionUpdate: an InPlace rollout updates the Machine (the
	// operation Update).
	DisruptionUpdate DisruptionReason = "Update"
	// DisruptionReboot: a person (or a tool) asks for a reboot.
	DisruptionReboot DisruptionReason = "Reboot"
	// DisruptionRepair: a person (or a tool) asks for a repair.
	DisruptionRepair DisruptionReason = "Repair"
	// DisruptionRemediation: a MachineHealthCheck's ladder acts on a
	// Machine that is still up.
	DisruptionRemediation DisruptionReason = "Remediation"
	// DisruptionExpiry: the Machine outlived its MachineDeployment's
	// expireAfter and is replaced.
	DisruptionExpiry DisruptionReason = "Expiry"
)

// MachineDisruptionBudgetSpec limits how many of the selected Machines may
// be disrupted on purpose at once, and when.
type MachineDisruptionBudgetSpec struct {
	// Selector picks the Machines this budget covers, in its own
	// namespace. It cannot be empty.
	// +required
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selector must not be empty: an empty selector would pick every Machine in the namespace; to mean every Machine, say so with a matchExpressions entry they all meet"
	Selector LabelSelector `json:"selector"`

	// MaxDisrupted is how many of the selected Machines may be disrupted
	// at once: a count, or a percentage of the selected Machines rounded
	// up. 0 allows no voluntary disruption at all, as a
	// PodDisruptionBudget's maxUnavailable of 0 does.
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 100000 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%"
	// +kubebuilder:validation:XIntOrString
	// +required
	MaxDisrupted intstr.IntOrString `json:"maxDisrupted"`

	// Reasons are the disruptions this budget limits; the others pass it
	// by. Empty means all of them.
	// +kubebuilder:validation:MaxItems=6
	// +listType=set
	// +optional
	Reasons []DisruptionReason `json:"reasons,omitempty"`

	// Windows are when the budget allows disruptions; outside every
	// window it allows none of its reasons. Empty means always.
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	Windows []DisruptionWindow `json:"windows,omitempty"`
}

// DisruptionWindow is a recurring stretch of time: it opens at each time
// Schedule names and stays open for Duration.
type DisruptionWindow struct {
	// Schedule is a cron schedule of five fields (minute, hour, day of
	// month, month, day of week), such as "0 2 * * 1-5" for 02:00 on
	// weekdays, or a descriptor such as "@daily".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') ? self in ['@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight', '@hourly'] : self.split(' ').filter(f, f != '').size() == 5",message="schedule must be a cron schedule of five fields, such as \"0 2 * * 1-5\", or one of @yearly, @monthly, @weekly, @daily, @hourly"
	Schedule string `json:"schedule"`

	// Duration is how long the window stays open each time, such as 4h.
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(\\\\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) > duration('0s')",message="duration must be a positive duration such as 30m or 4h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	Duration metav1.Duration `json:"duration"`

	// TimeZone the schedule is read in, an IANA name such as
	// Europe/Berlin; UTC when unset.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')",message="timeZone must be an IANA time zone name such as UTC or Europe/Berlin"
	// +optional
	TimeZone string `json:"timeZone,omitempty"`
}

// Disruption is one admitted voluntary disruption of a Machine, recorded
// in the budget the moment it is decided so that every actor (and a
// restarted manager) counts it.
type Disruption struct {
	// Machine is the disrupted Machine's name.
	Machine string `json:"machine"`
	// Reason is why it is disrupted.
	Reason DisruptionReason `json:"reason"`
	// Since is when the disruption was admitted.
	Since metav1.Time `json:"since"`
	// OperationID is the reboot, repair or update admitted, when the
	// disruption is one; the disruption ends once it has ended and the
	// Machine is Ready.
	// +optional
	OperationID string `json:"operationID,omitempty"`
	// By names who asked: a user, machinedeployment/<name>,
	// machinehealthcheck/<name>.
	// +optional
	By string `json:"by,omitempty"`
}

// MachineDisruptionBudgetStatus is what the budget allows now.
type MachineDisruptionBudgetStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// SelectedMachines counts the Machines the selector picks.
	// +optional
	SelectedMachines int32 `json:"selectedMachines"`
	// MaxDisrupted is spec.maxDisrupted resolved against SelectedMachines.
	// +optional
	MaxDisrupted int32 `json:"maxDisrupted"`
	// Disrupted counts the selected Machines out of service: those in
	// Disruptions and those down on their own (a Machine that ran and is
	// not Ready, or Failed).
	// +optional
	Disrupted int32 `json:"disrupted"`
	// DisruptionsAllowed is how many more may be disrupted now; 0 while
	// every window is closed.
	// +optional
	DisruptionsAllowed int32 `json:"disruptionsAllowed"`
	// WindowOpen says whether a window is open now (always true without
	// windows).
	// +optional
	WindowOpen bool `json:"windowOpen"`
	// NextWindow is when the next window opens, while none is open.
	// +optional
	NextWindow *metav1.Time `json:"nextWindow,omitempty"`
	// Disruptions are the voluntary disruptions admitted and not yet over.
	// +listType=map
	// +listMapKey=machine
	// +kubebuilder:validation:MaxItems=10000
	// +optional
	Disruptions []Disruption `json:"disruptions,omitempty"`
	// Conditions: DisruptionAllowed (False with the reason when none is).
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConditionDisruptionAllowed is a MachineDisruptionBudget's condition:
// True while it allows another disruption now.
const ConditionDisruptionAllowed = "DisruptionAllowed"

// Reasons of ConditionDisruptionAllowed.
const (
	// ReasonDisruptionAllowed: a window is open (or none is set) and
	// fewer Machines are disrupted than maxDisrupted.
	ReasonDisruptionAllowed = "Allowed"
	// ReasonBudgetSpent: as many Machines are disrupted as maxDisrupted
	// allows.
	ReasonBudgetSpent = "BudgetSpent"
	// ReasonWindowClosed: none of the budget's windows is open;
	// status.nextWindow says when one opens.
	ReasonWindowClosed = "WindowClosed"
	// ReasonInvalidWindow: a window's schedule cannot be read; the budget
	// allows nothing until it is fixed.
	ReasonInvalidWindow = "InvalidWindow"
)

// CauseDisruptionBudget is the type of the cause in the verbs server's
// 429 answer when a budget refuses a verb; the cause's field names the
// budget, as machinedisruptionbudget/<name>.
const CauseDisruptionBudget = "DisruptionBudget"

// MachineDisruptionBudget limits the voluntary disruptions of a set of
// Machines: how many at once, for which reasons, and in which windows.
// The verbs, every operation of a Running Machine (whoever asked for it)
// and a rollout's deletions ask it first; docs/disruption.md explains the
// model and says what does not ask yet.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=mdb,categories=machinist
// +kubebuilder:printcolumn:name="Max",type=string,JSONPath=`.spec.maxDisrupted`
// +kubebuilder:printcolumn:name="Selected",type=integer,JSONPath=`.status.selectedMachines`
// +kubebuilder:printcolumn:name="Disrupted",type=integer,JSONPath=`.status.disrupted`
// +kubebuilder:printcolumn:name="Allowed",type=integer,JSONPath=`.status.disruptionsAllowed`
// +kubebuilder:printcolumn:name="Next-Window",type=string,JSONPath=`.status.nextWindow`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineDisruptionBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineDisruptionBudgetSpec `json:"spec"`
	// +optional
	Status MachineDisruptionBudgetStatus `json:"status,omitempty"`
}

// MachineDisruptionBudgetList is a list of MachineDisruptionBudgets.
//
// +kubebuilder:object:root=true
type MachineDisruptionBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineDisruptionBudget `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineDisruptionBudget{}, &MachineDisruptionBudgetList{})
}
