package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the verbs.
const GroupName = "subresources.machinist.dev"

// SchemeGroupVersion is the group and version of every kind in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource and subresource names the verbs server serves and RBAC rules name.
const (
	// Machines is the parent resource of the verbs.
	Machines = "machines"
	// Reboot is the subresource that reboots a Machine.
	Reboot = "reboot"
	// Repair is the subresource that repairs (re-images) a Machine.
	Repair = "repair"
)

// RebootMode is how a Machine is rebooted.
type RebootMode string

// The reboot modes.
const (
	// RebootSoft asks the operating system to restart.
	RebootSoft RebootMode = "soft"
	// RebootHard power-cycles the instance.
	RebootHard RebootMode = "hard"
)

// RebootOptions is the body of PUT .../machines/{name}/reboot. Every field
// is optional; an empty body is a soft reboot after a drain.
//
// +kubebuilder:object:root=true
type RebootOptions struct {
	metav1.TypeMeta `json:",inline"`

	// Mode is soft (the default) or hard.
	// +optional
	Mode RebootMode `json:"mode,omitempty"`

	// Drain evicts the Machine's pods before the reboot. Default true.
	// +optional
	Drain *bool `json:"drain,omitempty"`

	// GracePeriodSeconds overrides each pod's termination grace period
	// during the drain; it must not be negative.
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`

	// OverrideDisruptionBudgets starts the operation even where a
	// MachineDisruptionBudget would refuse it. It needs a permission of
	// its own: the verb "override" on machinedisruptionbudgets
	// (machinist.dev) in the Machine's namespace, which no built-in role
	// grants. The disruption is still recorded in the budgets.
	// +optional
	OverrideDisruptionBudgets bool `json:"overrideDisruptionBudgets,omitempty"`
}

// RepairOptions is the body of PUT .../machines/{name}/repair. Every field
// is optional; an empty body is a repair after a drain.
//
// +kubebuilder:object:root=true
type RepairOptions struct {
	metav1.TypeMeta `json:",inline"`

	// Drain evicts the Machine's pods before the repair. Default true.
	// False re-images the machine under its pods, which then die with
	// it: the way to repair a machine whose cluster cannot be reached,
	// where nothing can be evicted.
	// +optional
	Drain *bool `json:"drain,omitempty"`

	// Reason says why the Machine needs repair; it is recorded with the
	// operation. At most 256 characters.
	// +optional
	Reason string `json:"reason,omitempty"`

	// GracePeriodSeconds overrides each pod's termination grace period
	// during the drain; it must not be negative.
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`

	// OverrideDisruptionBudgets starts the operation even where a
	// MachineDisruptionBudget would refuse it. It needs a permission of
	// its own: the verb "override" on machinedisruptionbudgets
	// (machinist.dev) in the Machine's namespace, which no built-in role
	// grants. The disruption is still recorded in the budgets.
	// +optional
	OverrideDisruptionBudgets bool `json:"overrideDisruptionBudgets,omitempty"`
}

// MachineOperation is the answer to an accepted verb (HTTP 202): the
// operation now recorded in the Machine's status.operation. Follow it there
// (kubectl get machine NAME -o jsonpath='{.status.operation}').
//
// +kubebuilder:object:root=true
type MachineOperation struct {
	metav1.TypeMeta `json:",inline"`
	// Name and Namespace are the Machine's.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Type is Reboot or Repair.
	Type string `json:"type"`
	// ID identifies the operation in status.operation.id.
	ID string `json:"id"`
	// State is Pending: the Machine controller carries the operation out.
	State string `json:"state"`
	// RequestedBy is the user the request was authenticated as.
	// +optional
	RequestedBy string `json:"requestedBy,omitempty"`
	// RequestedAt is when the request was recorded.
	// +optional
	RequestedAt metav1.Time `json:"requestedAt,omitempty"`
}

var schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &RebootOptions{}, &RepairOptions{}, &MachineOperation{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
})

// AddToScheme registers this package's kinds with a scheme.
var AddToScheme = schemeBuilder.AddToScheme
