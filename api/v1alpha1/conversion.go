package v1alpha1

import (
	"encoding/json"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiconversion "k8s.io/apimachinery/pkg/conversion"
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	"github.com/machinist-dev/machinist/api/v1beta1"
)

// ConversionDataAnnotation holds, on an object stored at v1beta1, what
// its v1alpha1 form said that v1beta1 has no field for, so that a client
// of v1alpha1 reads back what it wrote. It is written only when there is
// something to keep, and a client of v1beta1 should leave it alone.
const ConversionDataAnnotation = "machinist.dev/conversion-data"

// lost is what v1alpha1 can say and v1beta1 cannot. Every field is
// optional, so that an object with nothing to keep carries no annotation.
type lost struct {
	// FailureReason is kept only where it differs from what v1beta1's
	// phase and Ready condition say (Failure): nil means "as derived", an
	// empty string means empty. failureMessage is a field of v1beta1 too,
	// where empty means "as derived" (a Machine stored before v1beta1 had
	// it): FailureMessage keeps only an empty one where the derived one
	// is not.
	FailureReason  *string `json:"failureReason,omitempty"`
	FailureMessage *string `json:"failureMessage,omitempty"`

	// The parts of a Node's system info that v1beta1's NodeInfo leaves
	// out.
	KubeProxyVersion       string                 `json:"kubeProxyVersion,omitempty"`
	Swap                   *corev1.NodeSwapStatus `json:"swap,omitempty"`
	RunningInUserNamespace *bool                  `json:"runningInUserNamespace,omitempty"`

	// TimeAdded is each taint's timeAdded, by its place in the object's
	// one list of taints (a Machine's or a template's nodeTaints, a
	// class's nodeTemplate.taints).
	TimeAdded []*metav1.Time `json:"timeAdded,omitempty"`

	// ClassStatus is a MachineClass's status, which v1beta1 dropped.
	ClassStatus *MachineClassStatus `json:"classStatus,omitempty"`
}

func (l *lost) empty() bool {
	return l.FailureReason == nil && l.FailureMessage == nil && l.KubeProxyVersion == "" &&
		l.Swap == nil && l.RunningInUserNamespace == nil && len(l.TimeAdded) == 0 && l.ClassStatus == nil
}

// keep writes l into the annotation of a v1beta1 object's metadata, or
// removes the annotation when there is nothing to keep. The annotations
// map is copied first: the generated conversions share it with the source.
func keep(m *metav1.ObjectMeta, l *lost) error {
	annotations := maps.Clone(m.Annotations)
	delete(annotations, ConversionDataAnnotation)
	if !l.empty() {
		data, err := json.Marshal(l)
		if err != nil {
			return fmt.Errorf("keeping v1alpha1 fields of %s: %w", m.Name, err)
		}
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[ConversionDataAnnotation] = string(data)
	}
	if len(annotations) == 0 && m.Annotations == nil {
		annotations = nil
	}
	m.Annotations = annotations
	return nil
}

// restore takes what a v1beta1 object kept out of the metadata being
// converted to v1alpha1. Annotation data that cannot be read is dropped
// rather than failing the conversion, which would leave the object
// unreadable at v1alpha1: only v1alpha1's own extra fields are lost then.
func restore(m *metav1.ObjectMeta) *lost {
	var l lost
	data, ok := m.Annotations[ConversionDataAnnotation]
	if !ok {
		return &l
	}
	annotations := maps.Clone(m.Annotations)
	delete(annotations, ConversionDataAnnotation)
	if len(annotations) == 0 {
		annotations = nil
	}
	m.Annotations = annotations
	if err := json.Unmarshal([]byte(data), &l); err != nil {
		return &lost{}
	}
	return &l
}

// keepTimes records each taint's timeAdded, if any has one.
func keepTimes(l *lost, taints NodeTaints) {
	for i, t := range taints {
		if t.TimeAdded != nil {
			l.TimeAdded = make([]*metav1.Time, len(taints))
			for j := i; j < len(taints); j++ {
				l.TimeAdded[j] = taints[j].TimeAdded
			}
			return
		}
	}
}

// restoreTimes gives taints back the times keepTimes recorded.
func restoreTimes(l *lost, taints NodeTaints) {
	for i := range min(len(taints), len(l.TimeAdded)) {
		taints[i].TimeAdded = l.TimeAdded[i]
	}
}

// ConvertTo converts this Machine to the hub version, v1beta1.
func (src *Machine) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.Machine)
	if err := Convert_v1alpha1_Machine_To_v1beta1_Machine(src, dst, nil); err != nil {
		return err
	}
	var l lost
	reason, message := dst.Status.Failure()
	if src.Status.FailureReason != reason {
		l.FailureReason = &src.Status.FailureReason
	}
	if src.Status.FailureMessage == "" && message != "" {
		l.FailureMessage = &src.Status.FailureMessage
	}
	if info := src.Status.NodeInfo; info != nil {
		l.KubeProxyVersion, l.Swap, l.RunningInUserNamespace = info.KubeProxyVersion, info.Swap, info.RunningInUserNamespace
	}
	keepTimes(&l, src.Spec.NodeTaints)
	return keep(&dst.ObjectMeta, &l)
}

// ConvertFrom converts a v1beta1 Machine to this version.
func (dst *Machine) ConvertFrom(hub conversion.Hub) error {
	src := hub.(*v1beta1.Machine)
	if err := Convert_v1beta1_Machine_To_v1alpha1_Machine(src, dst, nil); err != nil {
		return err
	}
	l := restore(&dst.ObjectMeta)
	reason, message := src.Status.Failure()
	dst.Status.FailureReason = reason
	if dst.Status.FailureMessage == "" {
		dst.Status.FailureMessage = message
	}
	if l.FailureReason != nil {
		dst.Status.FailureReason = *l.FailureReason
	}
	if l.FailureMessage != nil {
		dst.Status.FailureMessage = *l.FailureMessage
	}
	if info := dst.Status.NodeInfo; info != nil {
		info.KubeProxyVersion, info.Swap, info.RunningInUserNamespace = l.KubeProxyVersion, l.Swap, l.RunningInUserNamespace
	}
	restoreTimes(l, dst.Spec.NodeTaints)
	return nil
}

// ConvertTo converts this MachineClass to the hub version, v1beta1.
func (src *MachineClass) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineClass)
	if err := Convert_v1alpha1_MachineClass_To_v1beta1_MachineClass(src, dst, nil); err != nil {
		return err
	}
	var l lost
	if st := src.Status; st.ObservedGeneration != 0 || len(st.Conditions) > 0 {
		l.ClassStatus = &st
	}
	if t := src.Spec.NodeTemplate; t != nil {
		keepTimes(&l, t.Taints)
	}
	return keep(&dst.ObjectMeta, &l)
}

// ConvertFrom converts a v1beta1 MachineClass to this version.
func (dst *MachineClass) ConvertFrom(hub conversion.Hub) error {
	src := hub.(*v1beta1.MachineClass)
	if err := Convert_v1beta1_MachineClass_To_v1alpha1_MachineClass(src, dst, nil); err != nil {
		return err
	}
	l := restore(&dst.ObjectMeta)
	dst.Status = MachineClassStatus{}
	if l.ClassStatus != nil {
		dst.Status = *l.ClassStatus
	}
	if t := dst.Spec.NodeTemplate; t != nil {
		restoreTimes(l, t.Taints)
	}
	return nil
}

// ConvertTo converts this MachineSet to the hub version, v1beta1.
func (src *MachineSet) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineSet)
	if err := Convert_v1alpha1_MachineSet_To_v1beta1_MachineSet(src, dst, nil); err != nil {
		return err
	}
	var l lost
	keepTimes(&l, src.Spec.Template.Spec.NodeTaints)
	return keep(&dst.ObjectMeta, &l)
}

// ConvertFrom converts a v1beta1 MachineSet to this version.
func (dst *MachineSet) ConvertFrom(hub conversion.Hub) error {
	src := hub.(*v1beta1.MachineSet)
	if err := Convert_v1beta1_MachineSet_To_v1alpha1_MachineSet(src, dst, nil); err != nil {
		return err
	}
	restoreTimes(restore(&dst.ObjectMeta), dst.Spec.Template.Spec.NodeTaints)
	return nil
}

// ConvertTo converts this MachineDeployment to the hub version, v1beta1.
func (src *MachineDeployment) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineDeployment)
	if err := Convert_v1alpha1_MachineDeployment_To_v1beta1_MachineDeployment(src, dst, nil); err != nil {
		return err
	}
	var l lost
	keepTimes(&l, src.Spec.Template.Spec.NodeTaints)
	return keep(&dst.ObjectMeta, &l)
}

// ConvertFrom converts a v1beta1 MachineDeployment to this version.
func (dst *MachineDeployment) ConvertFrom(hub conversion.Hub) error {
	src := hub.(*v1beta1.MachineDeployment)
	if err := Convert_v1beta1_MachineDeployment_To_v1alpha1_MachineDeployment(src, dst, nil); err != nil {
		return err
	}
	restoreTimes(restore(&dst.ObjectMeta), dst.Spec.Template.Spec.NodeTaints)
	return nil
}

// The kinds below lose nothing either way; their conversions still go
// through keep and restore, so that an annotation a client copied from
// another object does not travel on.

// ConvertTo converts this MachineHealthCheck to the hub version, v1beta1.
func (src *MachineHealthCheck) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineHealthCheck)
	if err := Convert_v1alpha1_MachineHealthCheck_To_v1beta1_MachineHealthCheck(src, dst, nil); err != nil {
		return err
	}
	return keep(&dst.ObjectMeta, &lost{})
}

// ConvertFrom converts a v1beta1 MachineHealthCheck to this version.
func (dst *MachineHealthCheck) ConvertFrom(hub conversion.Hub) error {
	if err := Convert_v1beta1_MachineHealthCheck_To_v1alpha1_MachineHealthCheck(hub.(*v1beta1.MachineHealthCheck), dst, nil); err != nil {
		return err
	}
	restore(&dst.ObjectMeta)
	return nil
}

// ConvertTo converts this MachineDisruptionBudget to the hub version, v1beta1.
func (src *MachineDisruptionBudget) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineDisruptionBudget)
	if err := Convert_v1alpha1_MachineDisruptionBudget_To_v1beta1_MachineDisruptionBudget(src, dst, nil); err != nil {
		return err
	}
	return keep(&dst.ObjectMeta, &lost{})
}

// ConvertFrom converts a v1beta1 MachineDisruptionBudget to this version.
func (dst *MachineDisruptionBudget) ConvertFrom(hub conversion.Hub) error {
	if err := Convert_v1beta1_MachineDisruptionBudget_To_v1alpha1_MachineDisruptionBudget(hub.(*v1beta1.MachineDisruptionBudget), dst, nil); err != nil {
		return err
	}
	restore(&dst.ObjectMeta)
	return nil
}

// ConvertTo converts this MachineDrainRule to the hub version, v1beta1.
func (src *MachineDrainRule) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.MachineDrainRule)
	if err := Convert_v1alpha1_MachineDrainRule_To_v1beta1_MachineDrainRule(src, dst, nil); err != nil {
		return err
	}
	return keep(&dst.ObjectMeta, &lost{})
}

// ConvertFrom converts a v1beta1 MachineDrainRule to this version.
func (dst *MachineDrainRule) ConvertFrom(hub conversion.Hub) error {
	if err := Convert_v1beta1_MachineDrainRule_To_v1alpha1_MachineDrainRule(hub.(*v1beta1.MachineDrainRule), dst, nil); err != nil {
		return err
	}
	restore(&dst.ObjectMeta)
	return nil
}

// ConvertTo converts this WorkloadCluster to the hub version, v1beta1.
func (src *WorkloadCluster) ConvertTo(hub conversion.Hub) error {
	dst := hub.(*v1beta1.WorkloadCluster)
	if err := Convert_v1alpha1_WorkloadCluster_To_v1beta1_WorkloadCluster(src, dst, nil); err != nil {
		return err
	}
	return keep(&dst.ObjectMeta, &lost{})
}

// ConvertFrom converts a v1beta1 WorkloadCluster to this version.
func (dst *WorkloadCluster) ConvertFrom(hub conversion.Hub) error {
	if err := Convert_v1beta1_WorkloadCluster_To_v1alpha1_WorkloadCluster(hub.(*v1beta1.WorkloadCluster), dst, nil); err != nil {
		return err
	}
	restore(&dst.ObjectMeta)
	return nil
}

// The field conversions the generator cannot write: fields renamed,
// moved, or whose values are spelled differently.

// Convert_v1alpha1_MachineClass_To_v1beta1_MachineClass converts a class;
// its status, which v1beta1 dropped, is kept by ConvertTo.
func Convert_v1alpha1_MachineClass_To_v1beta1_MachineClass(in *MachineClass, out *v1beta1.MachineClass, s apiconversion.Scope) error {
	return autoConvert_v1alpha1_MachineClass_To_v1beta1_MachineClass(in, out, s)
}

// Convert_v1alpha1_MachineStatus_To_v1beta1_MachineStatus converts a
// Machine's status; failureReason and failureMessage, which v1beta1
// dropped, are kept by ConvertTo where its Ready condition does not say
// them.
func Convert_v1alpha1_MachineStatus_To_v1beta1_MachineStatus(in *MachineStatus, out *v1beta1.MachineStatus, s apiconversion.Scope) error {
	return autoConvert_v1alpha1_MachineStatus_To_v1beta1_MachineStatus(in, out, s)
}

// Convert_v1alpha1_MachineDrainRuleSpec_To_v1beta1_MachineDrainRuleSpec
// moves spec.drain's behavior and order up into spec.
func Convert_v1alpha1_MachineDrainRuleSpec_To_v1beta1_MachineDrainRuleSpec(in *MachineDrainRuleSpec, out *v1beta1.MachineDrainRuleSpec, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_MachineDrainRuleSpec_To_v1beta1_MachineDrainRuleSpec(in, out, s); err != nil {
		return err
	}
	out.Behavior = v1beta1.DrainBehavior(in.Drain.Behavior)
	out.Order = in.Drain.Order
	return nil
}

// Convert_v1beta1_MachineDrainRuleSpec_To_v1alpha1_MachineDrainRuleSpec
// moves behavior and order back into spec.drain.
func Convert_v1beta1_MachineDrainRuleSpec_To_v1alpha1_MachineDrainRuleSpec(in *v1beta1.MachineDrainRuleSpec, out *MachineDrainRuleSpec, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_MachineDrainRuleSpec_To_v1alpha1_MachineDrainRuleSpec(in, out, s); err != nil {
		return err
	}
	out.Drain = MachineDrainRuleDrain{Behavior: DrainBehavior(in.Behavior), Order: in.Order}
	return nil
}

// Convert_v1alpha1_NodeTemplate_To_v1beta1_NodeTemplate renames a class's
// labels and taints to nodeLabels and nodeTaints, as a Machine has.
func Convert_v1alpha1_NodeTemplate_To_v1beta1_NodeTemplate(in *NodeTemplate, out *v1beta1.NodeTemplate, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_NodeTemplate_To_v1beta1_NodeTemplate(in, out, s); err != nil {
		return err
	}
	out.NodeLabels = v1beta1.NodeLabels(in.Labels)
	return convertTaintsTo(in.Taints, &out.NodeTaints)
}

// Convert_v1beta1_NodeTemplate_To_v1alpha1_NodeTemplate renames them back.
func Convert_v1beta1_NodeTemplate_To_v1alpha1_NodeTemplate(in *v1beta1.NodeTemplate, out *NodeTemplate, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_NodeTemplate_To_v1alpha1_NodeTemplate(in, out, s); err != nil {
		return err
	}
	out.Labels = map[string]string(in.NodeLabels)
	return convertTaintsFrom(in.NodeTaints, &out.Taints)
}

func convertTaintsTo(in NodeTaints, out *v1beta1.NodeTaints) error {
	*out = nil
	if in == nil {
		return nil
	}
	*out = make(v1beta1.NodeTaints, len(in))
	for i := range in {
		if err := Convert_v1_Taint_To_v1beta1_Taint(&in[i], &(*out)[i], nil); err != nil {
			return err
		}
	}
	return nil
}

func convertTaintsFrom(in v1beta1.NodeTaints, out *NodeTaints) error {
	*out = nil
	if in == nil {
		return nil
	}
	*out = make(NodeTaints, len(in))
	for i := range in {
		if err := Convert_v1beta1_Taint_To_v1_Taint(&in[i], &(*out)[i], nil); err != nil {
			return err
		}
	}
	return nil
}

// Convert_v1_Taint_To_v1beta1_Taint converts a taint; its timeAdded, which
// v1beta1 has no field for, is kept by ConvertTo.
func Convert_v1_Taint_To_v1beta1_Taint(in *corev1.Taint, out *v1beta1.Taint, _ apiconversion.Scope) error {
	*out = v1beta1.Taint{Key: in.Key, Value: in.Value, Effect: in.Effect}
	return nil
}

// Convert_v1beta1_Taint_To_v1_Taint converts a taint back.
func Convert_v1beta1_Taint_To_v1_Taint(in *v1beta1.Taint, out *corev1.Taint, _ apiconversion.Scope) error {
	*out = in.AsCore()
	return nil
}

// Convert_v1_NodeSystemInfo_To_v1beta1_NodeInfo copies what a Node
// reports into v1beta1's own type; what it leaves out is kept by
// ConvertTo.
func Convert_v1_NodeSystemInfo_To_v1beta1_NodeInfo(in *corev1.NodeSystemInfo, out *v1beta1.NodeInfo, _ apiconversion.Scope) error {
	*out = *v1beta1.NodeInfoOf(*in)
	return nil
}

// Convert_v1beta1_NodeInfo_To_v1_NodeSystemInfo copies it back.
func Convert_v1beta1_NodeInfo_To_v1_NodeSystemInfo(in *v1beta1.NodeInfo, out *corev1.NodeSystemInfo, _ apiconversion.Scope) error {
	*out = corev1.NodeSystemInfo{
		MachineID: in.MachineID, SystemUUID: in.SystemUUID, BootID: in.BootID,
		KernelVersion: in.KernelVersion, OSImage: in.OSImage,
		ContainerRuntimeVersion: in.ContainerRuntimeVersion, KubeletVersion: in.KubeletVersion,
		OperatingSystem: in.OperatingSystem, Architecture: in.Architecture,
	}
	return nil
}

// Convert_v1alpha1_OperationOptions_To_v1beta1_OperationOptions turns
// drain into skipDrain and spells the reboot mode in PascalCase.
func Convert_v1alpha1_OperationOptions_To_v1beta1_OperationOptions(in *OperationOptions, out *v1beta1.OperationOptions, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_OperationOptions_To_v1beta1_OperationOptions(in, out, s); err != nil {
		return err
	}
	out.Mode = modeTo(in.Mode)
	out.SkipDrain = nil
	if in.Drain != nil {
		out.SkipDrain = new(!*in.Drain)
	}
	return nil
}

// Convert_v1beta1_OperationOptions_To_v1alpha1_OperationOptions turns
// them back.
func Convert_v1beta1_OperationOptions_To_v1alpha1_OperationOptions(in *v1beta1.OperationOptions, out *OperationOptions, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_OperationOptions_To_v1alpha1_OperationOptions(in, out, s); err != nil {
		return err
	}
	out.Mode = modeFrom(in.Mode)
	out.Drain = nil
	if in.SkipDrain != nil {
		out.Drain = new(!*in.SkipDrain)
	}
	return nil
}

// Convert_v1alpha1_Rung_To_v1beta1_Rung spells a rung's reboot mode in
// PascalCase.
func Convert_v1alpha1_Rung_To_v1beta1_Rung(in *Rung, out *v1beta1.Rung, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_Rung_To_v1beta1_Rung(in, out, s); err != nil {
		return err
	}
	out.Mode = modeTo(in.Mode)
	return nil
}

// Convert_v1beta1_Rung_To_v1alpha1_Rung spells it as v1alpha1 does.
func Convert_v1beta1_Rung_To_v1alpha1_Rung(in *v1beta1.Rung, out *Rung, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_Rung_To_v1alpha1_Rung(in, out, s); err != nil {
		return err
	}
	out.Mode = modeFrom(in.Mode)
	return nil
}

// v1alpha1's modes are the only enum in lower case. A value that is
// neither is passed on as it is: the schemas refuse it anyway.
func modeTo(m string) v1beta1.RebootMode {
	switch m {
	case "soft":
		return v1beta1.RebootSoft
	case "hard":
		return v1beta1.RebootHard
	}
	return v1beta1.RebootMode(m)
}

func modeFrom(m v1beta1.RebootMode) string {
	switch m {
	case v1beta1.RebootSoft:
		return "soft"
	case v1beta1.RebootHard:
		return "hard"
	}
	return string(m)
}

// Convert_v1alpha1_MachineDisruptionBudgetSpec_To_v1beta1_MachineDisruptionBudgetSpec
// renames the reason InPlaceUpdate to Update.
func Convert_v1alpha1_MachineDisruptionBudgetSpec_To_v1beta1_MachineDisruptionBudgetSpec(in *MachineDisruptionBudgetSpec, out *v1beta1.MachineDisruptionBudgetSpec, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_MachineDisruptionBudgetSpec_To_v1beta1_MachineDisruptionBudgetSpec(in, out, s); err != nil {
		return err
	}
	if in.Reasons != nil {
		out.Reasons = make([]v1beta1.DisruptionReason, len(in.Reasons))
		for i, r := range in.Reasons {
			out.Reasons[i] = reasonTo(r)
		}
	}
	return nil
}

// Convert_v1beta1_MachineDisruptionBudgetSpec_To_v1alpha1_MachineDisruptionBudgetSpec
// renames it back.
func Convert_v1beta1_MachineDisruptionBudgetSpec_To_v1alpha1_MachineDisruptionBudgetSpec(in *v1beta1.MachineDisruptionBudgetSpec, out *MachineDisruptionBudgetSpec, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_MachineDisruptionBudgetSpec_To_v1alpha1_MachineDisruptionBudgetSpec(in, out, s); err != nil {
		return err
	}
	if in.Reasons != nil {
		out.Reasons = make([]DisruptionReason, len(in.Reasons))
		for i, r := range in.Reasons {
			out.Reasons[i] = reasonFrom(r)
		}
	}
	return nil
}

// Convert_v1alpha1_Disruption_To_v1beta1_Disruption renames the reason of
// a disruption a budget counts.
func Convert_v1alpha1_Disruption_To_v1beta1_Disruption(in *Disruption, out *v1beta1.Disruption, s apiconversion.Scope) error {
	if err := autoConvert_v1alpha1_Disruption_To_v1beta1_Disruption(in, out, s); err != nil {
		return err
	}
	out.Reason = reasonTo(in.Reason)
	return nil
}

// Convert_v1beta1_Disruption_To_v1alpha1_Disruption renames it back.
func Convert_v1beta1_Disruption_To_v1alpha1_Disruption(in *v1beta1.Disruption, out *Disruption, s apiconversion.Scope) error {
	if err := autoConvert_v1beta1_Disruption_To_v1alpha1_Disruption(in, out, s); err != nil {
		return err
	}
	out.Reason = reasonFrom(in.Reason)
	return nil
}

func reasonTo(r DisruptionReason) v1beta1.DisruptionReason {
	if r == DisruptionInPlaceUpdate {
		return v1beta1.DisruptionUpdate
	}
	return v1beta1.DisruptionReason(r)
}

func reasonFrom(r v1beta1.DisruptionReason) DisruptionReason {
	if r == v1beta1.DisruptionUpdate {
		return DisruptionInPlaceUpdate
	}
	return DisruptionReason(r)
}

// Convert_v1_LabelSelector_To_v1beta1_LabelSelector converts a health
// check's selector, metav1's in v1alpha1, to the bounded one every v1beta1
// kind uses.
func Convert_v1_LabelSelector_To_v1beta1_LabelSelector(in *metav1.LabelSelector, out *v1beta1.LabelSelector, _ apiconversion.Scope) error {
	*out = v1beta1.LabelSelector{MatchLabels: in.MatchLabels}
	if in.MatchExpressions != nil {
		out.MatchExpressions = make([]v1beta1.LabelSelectorRequirement, len(in.MatchExpressions))
		for i, r := range in.MatchExpressions {
			out.MatchExpressions[i] = v1beta1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator, Values: r.Values}
		}
	}
	return nil
}

// Convert_v1beta1_LabelSelector_To_v1_LabelSelector converts it back.
func Convert_v1beta1_LabelSelector_To_v1_LabelSelector(in *v1beta1.LabelSelector, out *metav1.LabelSelector, _ apiconversion.Scope) error {
	*out = *in.AsMeta()
	return nil
}
