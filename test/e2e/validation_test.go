package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// invalidCase is one object the API server must refuse. When update is nil,
// build's object is refused on create; otherwise it is created (it is
// valid), update changes it, and the update is refused. want is everything
// the server says after `<Kind>.machinist.dev "<name>" is invalid: `, so a
// second error, a different field path or a reworded message fails the case.
type invalidCase struct {
	name   string
	build  func(ns string) client.Object
	update func(client.Object)
	want   string
}

// minInvalidCases keeps the table from shrinking unnoticed.
const minInvalidCases = 40

// The messages of the rules that several cases break, as the server words them.
const (
	replicasMsg         = "replicas must be zero or more"
	minReadyMsg         = "minReadySeconds must be zero or more"
	emptySelectorMsg    = "selector must not be empty: an empty selector would claim every Machine in the namespace"
	matchLabelsMsg      = "selector does not match the template's labels: every Machine made from the template must be selected by the selector"
	matchExprsMsg       = "selector's matchExpressions do not match the template's labels: every Machine made from the template must be selected by the selector"
	bothZeroMsg         = "maxSurge and maxUnavailable cannot both be zero: the rollout could never replace a Machine"
	maxSurgeMsg         = "maxSurge must be a whole number of Machines (0 or more) or a percentage such as 25%"
	maxUnavailableMsg   = "maxUnavailable must be a whole number of Machines (0 or more) or a percentage from 0% to 100%"
	inPlaceUnavailMsg   = "maxUnavailable must be a whole number of Machines (1 or more) or a percentage from 1% to 100%: an in-place rollout takes each Machine out of service while it is updated"
	deadlineMsg         = "progressDeadlineSeconds must be more than zero"
	deadlineMinReadyMsg = "progressDeadlineSeconds must be greater than minReadySeconds, or every rollout would stall before a new Machine could count as available"
	templateIDMsg       = "a template cannot set providerID: every Machine made from it gets its own instance"
	selectorValuesMsg   = "In and NotIn need at least one value; Exists and DoesNotExist take none"
	lateProviderIDMsg   = "providerID can be set only when the Machine is created (a Machine adopts its instance as it is provisioned, not after): create a new Machine that names the instance"
	versionMsg          = "version must be a Kubernetes version such as v1.37.2 or v1.38.0-rc.1"
	taintEffectMsg      = "taint effect must be one of NoSchedule, PreferNoSchedule or NoExecute"
	taintKeyMsg         = "every taint needs a key"
	capacityKeyMsg      = "every capacity key must be a resource name such as cpu, memory, hugepages-2Mi or nvidia.com/gpu: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally after a DNS subdomain prefix and '/'"
	drainTimeoutMsg     = "drain timeout must be a duration such as 90s, 5m or 1h30m"
	drainGraceMsg       = "drain gracePeriodSeconds must be zero or more"
	volumeDetachMsg     = "drain volumeDetachTimeout must be a duration such as 90s, 5m or 1h30m"
	nodeDeletionMsg     = "drain nodeDeletionTimeout must be a duration such as 10s, 5m or 1h30m"
	ruleOrderMsg        = "order can be set only with behavior Drain: Skip and WaitCompleted pods are never evicted, so they have no place in the order"
	rulePodsEntryMsg    = "each pods entry needs a selector, a namespaceSelector or both; to select every pod, leave pods empty"
	ruleMachinesOnceMsg = "each machines entry may be listed once"
	rulePodsOnceMsg     = "each pods entry may be listed once"

	replaceLastMsg       = "Replace must be the last rung, and only one: nothing can follow a Machine that was deleted"
	rungModeMsg          = "mode applies only to a Reboot rung"
	rungTimeoutNeededMsg = "a Reboot or Repair rung needs a timeout: how long it may take to bring the Machine back healthy"
	replaceTimeoutMsg    = "a Replace rung takes no timeout: the Machine is deleted and its MachineSet makes a new one"
	rungTimeoutMsg       = "a rung's timeout must be a duration of at least 1s, such as 5m"
	maxInFlightMsg       = "maxInFlight must be a whole number of Machines (1 or more) or a percentage from 1% to 100%"
	maxUnhealthyMsg      = "maxUnhealthy must be a whole number of Machines (0 or more) or a percentage from 0% to 100%"
	conditionTimeoutMsg  = "a condition's timeout must be a duration such as 60s or 5m"
	nodeStartupMsg       = "nodeStartupTimeout must be a duration such as 90s, 10m or 1h"
	cooldownMsg          = "cooldown must be a duration such as 30m or 1h"

	clusterNamespaceMsg = "clusterName is the name of a WorkloadCluster in the Machine's own namespace, not namespace/name: a Machine cannot serve a cluster declared in another namespace"
	clusterNameMsg      = "clusterName must be the name of a WorkloadCluster: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	clusterImmutableMsg = "clusterName cannot be set, changed or removed once the Machine exists: a Machine serves one cluster for life; make a new Machine in the other cluster"
	secretRequiredMsg   = "secretName is required: name the Secret that holds the cluster's kubeconfig"
	secretNamespaceMsg  = "secretName is the name of a Secret in the WorkloadCluster's own namespace, not namespace/name: a Secret in another namespace cannot be named"
	secretNameMsg       = "secretName must be the name of a Secret: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	secretKeyMsg        = "key must be a key of a Secret's data: letters, digits, '-', '_' and '.', and neither '.' nor starting with '..'"
	joinRequiredMsg     = "joinEndpoint.server is required: the https://host[:port] address at which machines join the cluster"
	joinURLMsg          = "server must be an https URL such as https://10.0.0.10:6443: https://, a host, and optionally a port"
	joinPathMsg         = "server must be https://host[:port] alone, with no path, query or fragment: a machine joins the API server at its root"
	joinUserMsg         = "server must not carry a user or password (user@host): a machine authenticates with its bootstrap token"

	maxDisruptedMsg   = "maxDisrupted must be a whole number of Machines (0 or more) or a percentage from 0% to 100%"
	reasonOnceMsg     = "each reason may be listed once"
	scheduleMsg       = `schedule must be a cron schedule of five fields, such as "0 2 * * 1-5", or one of @yearly, @monthly, @weekly, @daily, @hourly`
	windowDurationMsg = "duration must be a positive duration such as 30m or 4h"
	timeZoneMsg       = "timeZone must be an IANA time zone name such as UTC or Europe/Berlin"
)

// errs is how the server joins several errors about one object.
func errs(each ...string) string {
	if len(each) == 1 {
		return each[0]
	}
	return "[" + strings.Join(each, ", ") + "]"
}

// schemaErr is the message for an object that breaks a length, count, enum,
// type or required field of the schema: the server then skips the CEL rules
// and says so in a second error. A broken pattern or minimum length does not
// stop the CEL rules.
func schemaErr(e string) string {
	return errs(e, "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")
}

// negativeReplicas is what the server says of a negative spec.replicas:
// the scale subresource's own check (its field path starts with a dot)
// comes before this API's rule.
const negativeReplicas = "[.spec.replicas: Invalid value: -1: should be a non-negative integer, spec.replicas: Invalid value: -1: " + replicasMsg + "]"

// validMachineDrainRule drains the pods labelled app=db last on the
// Machines labelled tier=data.
func validMachineDrainRule(ns, name string) *machinistv1.MachineDrainRule {
	return &machinistv1.MachineDrainRule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDrainRuleSpec{
			Drain:    machinistv1.MachineDrainRuleDrain{Behavior: machinistv1.DrainBehaviorDrain, Order: ptr.To[int32](10)},
			Machines: []machinistv1.MachineDrainRuleMachineSelector{{Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"tier": "data"}}}},
			Pods: []machinistv1.MachineDrainRulePodSelector{{
				Selector:          &machinistv1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
				NamespaceSelector: &machinistv1.LabelSelector{MatchLabels: map[string]string{"team": "data"}},
			}},
		},
	}
}

// validMachineDisruptionBudget lets one of the Machines labelled pool=name
// be disrupted at a time, for any reason, at any time.
func validMachineDisruptionBudget(ns, name string) *machinistv1.MachineDisruptionBudget {
	return &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDisruptionBudgetSpec{
			Selector:     machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
			MaxDisrupted: intstr.FromInt32(1),
		},
	}
}

// budgetYAML is a MachineDisruptionBudget written as a user's YAML would
// be: its selector, maxDisrupted 1, and the spec fields given, exactly as
// given. The Go type cannot send a malformed duration, an empty list
// (omitempty drops it) or a spec without maxDisrupted.
func budgetYAML(ns, name string, spec map[string]any) *unstructured.Unstructured {
	s := map[string]any{
		"selector":     map[string]any{"matchLabels": map[string]any{"pool": name}},
		"maxDisrupted": int64(1),
	}
	maps.Copy(s, spec)
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": machinistv1.GroupVersion.String(),
		"kind":       "MachineDisruptionBudget",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       s,
	}}
}

// window is a disruption window; duration is parsed as Go parses it.
func window(schedule, duration, timeZone string) machinistv1.DisruptionWindow {
	d, err := time.ParseDuration(duration)
	if err != nil {
		panic(err)
	}
	return machinistv1.DisruptionWindow{Schedule: schedule, Duration: metav1.Duration{Duration: d}, TimeZone: timeZone}
}

// budgetWithWindows is a valid MachineDisruptionBudget with these windows.
func budgetWithWindows(ns, name string, windows ...machinistv1.DisruptionWindow) *machinistv1.MachineDisruptionBudget {
	mdb := validMachineDisruptionBudget(ns, name)
	mdb.Spec.Windows = windows
	return mdb
}

// labels returns n distinct labels, to go over a size limit.
func labels(n int) map[string]string {
	out := make(map[string]string, n)
	for i := range n {
		out[fmt.Sprintf("l%d", i)] = "x"
	}
	return out
}

var invalidCases = []invalidCase{
	// MachineSet.
	{
		name: "MachineSet with negative replicas",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "neg", 1)
			ms.Spec.Replicas = ptr.To(int32(-1))
			return ms
		},
		want: negativeReplicas,
	},
	{
		name: "MachineSet whose selector misses the template's labels",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "mismatch", 1)
			ms.Spec.Template.Metadata.Labels = map[string]string{"pool": "other"}
			return ms
		},
		want: "spec: Invalid value: " + matchLabelsMsg,
	},
	{
		name: "MachineSet whose template has no labels at all",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "bare", 1)
			ms.Spec.Template.Metadata = machinistv1.TemplateMetadata{}
			return ms
		},
		want: "spec: Invalid value: " + matchLabelsMsg,
	},
	{
		name: "MachineSet whose NotIn expression excludes the template's label",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "notin", 1)
			ms.Spec.Selector = machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"notin"}},
			}}
			return ms
		},
		want: "spec: Invalid value: " + matchExprsMsg,
	},
	{
		name: "MachineSet whose Exists expression names a label the template lacks",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "exists", 1)
			ms.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "zone", Operator: metav1.LabelSelectorOpExists},
			}
			return ms
		},
		want: "spec: Invalid value: " + matchExprsMsg,
	},
	{
		name: "MachineSet with an empty selector",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "empty", 1)
			ms.Spec.Selector = machinistv1.LabelSelector{}
			return ms
		},
		want: "spec: Invalid value: " + emptySelectorMsg,
	},
	{
		name: "MachineSet whose selector changes",
		build: func(ns string) client.Object {
			return validMachineSet(ns, "moving", 1)
		},
		update: func(o client.Object) {
			ms := o.(*machinistv1.MachineSet)
			ms.Spec.Selector.MatchLabels = map[string]string{"pool": "moving", "tier": "x"}
			ms.Spec.Template.Metadata.Labels = map[string]string{"pool": "moving", "tier": "x"}
		},
		want: "spec.selector: Invalid value: selector is immutable: create a new MachineSet to select other Machines",
	},
	{
		name: "MachineSet with an unknown delete policy",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "policy", 1)
			ms.Spec.DeletePolicy = "Biggest"
			return ms
		},
		want: schemaErr(`spec.deletePolicy: Unsupported value: "Biggest": supported values: "Random", "Newest", "Oldest"`),
	},
	{
		name: "MachineSet template that names a providerID",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "pinned", 1)
			ms.Spec.Template.Spec.ProviderID = "inmemory:///a"
			return ms
		},
		want: "spec.template: Invalid value: " + templateIDMsg,
	},
	{
		name: "MachineSet template that names a cluster in another namespace",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "elsewhere", 1)
			ms.Spec.Template.Spec.ClusterName = "other/prod"
			return ms
		},
		want: `spec.template.spec.clusterName: Invalid value: "other/prod": ` + clusterNamespaceMsg,
	},
	{
		name: "MachineSet template whose clusterName changes to one that is not a name",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "moving", 1)
			ms.Spec.Template.Spec.ClusterName = "prod"
			return ms
		},
		update: func(o client.Object) { o.(*machinistv1.MachineSet).Spec.Template.Spec.ClusterName = "Staging" },
		want:   `spec.template.spec.clusterName: Invalid value: "Staging": ` + clusterNameMsg,
	},
	{
		name: "MachineSet with negative minReadySeconds",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "impatient", 1)
			ms.Spec.MinReadySeconds = -1
			return ms
		},
		want: "spec.minReadySeconds: Invalid value: -1: " + minReadyMsg,
	},
	{
		name: "MachineSet template with a version that is not a Kubernetes version",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "fruit", 1)
			ms.Spec.Template.Spec.Version = "banana"
			return ms
		},
		want: `spec.template.spec.version: Invalid value: "banana": ` + versionMsg,
	},
	{
		name: "MachineSet whose selector has more than 16 labels",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "picky", 1)
			ms.Spec.Selector.MatchLabels = labels(17)
			ms.Spec.Template.Metadata.Labels = labels(17)
			return ms
		},
		want: schemaErr("spec.selector.matchLabels: Too many: 17: must have at most 16 items"),
	},
	{
		name: "MachineSet template with more than 64 labels",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "labelled", 1)
			ms.Spec.Template.Metadata.Labels = labels(65)
			ms.Spec.Template.Metadata.Labels["pool"] = "labelled"
			return ms
		},
		want: schemaErr("spec.template.metadata.labels: Too many: 66: must have at most 64 items"),
	},

	{
		name: "MachineSet whose selector has more than 16 expressions",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "wordy", 1)
			for range 17 {
				ms.Spec.Selector.MatchExpressions = append(ms.Spec.Selector.MatchExpressions,
					machinistv1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpExists})
			}
			return ms
		},
		want: schemaErr("spec.selector.matchExpressions: Too many: 17: must have at most 16 items"),
	},
	{
		name: "MachineSet whose selector key is longer than a label key can be",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "longkey", 1)
			ms.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: strings.Repeat("k", 318), Operator: metav1.LabelSelectorOpDoesNotExist},
			}
			return ms
		},
		want: schemaErr("spec.selector.matchExpressions[0].key: Too long: may not be more than 317 bytes"),
	},
	{
		// Written as YAML would be: the Go type always sends a template.
		name: "MachineSet without a template",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineSet",
				"metadata":   map[string]any{"namespace": ns, "name": "hollow"},
				"spec": map[string]any{
					"selector": map[string]any{"matchLabels": map[string]any{"pool": "hollow"}},
				},
			}}
		},
		want: schemaErr("spec.template: Required value"),
	},

	{
		// The Go type cannot hold the number, so this object is written as
		// YAML would be. The server's own checks word this one.
		name: "MachineSet with more replicas than an int32 holds",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineSet",
				"metadata":   map[string]any{"namespace": ns, "name": "huge"},
				"spec": map[string]any{
					"replicas": int64(1) << 31,
					"selector": map[string]any{"matchLabels": map[string]any{"pool": "huge"}},
					"template": map[string]any{
						"metadata": map[string]any{"labels": map[string]any{"pool": "huge"}},
						"spec":     map[string]any{"classRef": map[string]any{"name": "small"}},
					},
				},
			}}
		},
		want: errs(`<nil>: Invalid value: "": Checked value must be of type integer with format int32 in spec.replicas`,
			".spec.replicas: Invalid value: 2147483648: should be less than or equal to 2147483647"),
	},

	// MachineDeployment.
	{
		name: "MachineDeployment with negative replicas",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "neg")
			md.Spec.Replicas = ptr.To(int32(-1))
			return md
		},
		want: negativeReplicas,
	},
	{
		name: "MachineDeployment whose selector misses the template's labels",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "mismatch")
			md.Spec.Selector.MatchLabels = map[string]string{"pool": "mismatch", "tier": "gpu"}
			return md
		},
		want: "spec: Invalid value: " + matchLabelsMsg,
	},
	{
		name: "MachineDeployment whose In expression misses the template's labels",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "exprs")
			md.Spec.Selector = machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
			}}
			return md
		},
		want: "spec: Invalid value: " + matchExprsMsg,
	},
	{
		name: "MachineDeployment whose DoesNotExist expression names a label the template has",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "absent")
			md.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpDoesNotExist},
			}
			return md
		},
		want: "spec: Invalid value: " + matchExprsMsg,
	},
	{
		name: "MachineDeployment with an empty selector",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "empty")
			md.Spec.Selector = machinistv1.LabelSelector{}
			return md
		},
		want: "spec: Invalid value: " + emptySelectorMsg,
	},
	{
		name: "MachineDeployment whose selector changes",
		build: func(ns string) client.Object {
			return validMachineDeployment(ns, "moving")
		},
		update: func(o client.Object) {
			md := o.(*machinistv1.MachineDeployment)
			md.Spec.Selector.MatchLabels = map[string]string{"pool": "elsewhere"}
			md.Spec.Template.Metadata.Labels = map[string]string{"pool": "elsewhere"}
		},
		want: "spec.selector: Invalid value: selector is immutable: create a new MachineDeployment to select other Machines",
	},
	{
		name: "MachineDeployment with an empty selector key",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "keyless")
			// DoesNotExist of a key no label has holds, so only the key's
			// own length is wrong.
			md.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "", Operator: metav1.LabelSelectorOpDoesNotExist},
			}
			return md
		},
		want: `spec.selector.matchExpressions[0].key: Invalid value: "": spec.selector.matchExpressions[0].key in body should be at least 1 chars long`,
	},
	{
		name: "MachineDeployment with an unknown selector operator",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "operator")
			// A key the template lacks, so the matchExpressions rule (which
			// reads an unknown operator as DoesNotExist) holds.
			md.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "zone", Operator: "Matches"},
			}
			return md
		},
		want: schemaErr(`spec.selector.matchExpressions[0].operator: Unsupported value: "Matches": supported values: "In", "NotIn", "Exists", "DoesNotExist"`),
	},
	{
		name: "MachineDeployment template that names a providerID",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "pinned")
			md.Spec.Template.Spec.ProviderID = "inmemory:///a"
			return md
		},
		want: "spec.template: Invalid value: " + templateIDMsg,
	},
	{
		name: "MachineDeployment template whose clusterName is not a name",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "bad-cluster")
			md.Spec.Template.Spec.ClusterName = "prod_eu"
			return md
		},
		want: `spec.template.spec.clusterName: Invalid value: "prod_eu": ` + clusterNameMsg,
	},
	{
		name: "MachineDeployment template whose clusterName changes to one in another namespace",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "moving")
			md.Spec.Template.Spec.ClusterName = "prod"
			return md
		},
		update: func(o client.Object) {
			o.(*machinistv1.MachineDeployment).Spec.Template.Spec.ClusterName = "fleet/prod"
		},
		want: `spec.template.spec.clusterName: Invalid value: "fleet/prod": ` + clusterNamespaceMsg,
	},
	{
		name: "MachineDeployment with maxSurge 0% and maxUnavailable 0",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "stuck")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("0%"))
			return md
		},
		want: "spec.strategy.rollingUpdate: Invalid value: " + bothZeroMsg,
	},
	{
		name: "MachineDeployment with maxSurge 0 and maxUnavailable 0",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "stuck-counts")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(0))
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(0))
			return md
		},
		want: "spec.strategy.rollingUpdate: Invalid value: " + bothZeroMsg,
	},
	{
		name: "MachineDeployment with maxSurge 0% and maxUnavailable 0%",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "stuck-percent")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("0%"))
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("0%"))
			return md
		},
		want: "spec.strategy.rollingUpdate: Invalid value: " + bothZeroMsg,
	},
	{
		name: "MachineDeployment with a malformed maxSurge",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "surge")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("ten"))
			return md
		},
		want: `spec.strategy.rollingUpdate.maxSurge: Invalid value: "ten": ` + maxSurgeMsg,
	},
	{
		name: "MachineDeployment with a negative maxSurge",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "shrink")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(-1))
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
			return md
		},
		want: "spec.strategy.rollingUpdate.maxSurge: Invalid value: -1: " + maxSurgeMsg,
	},
	{
		name: "MachineDeployment with maxUnavailable over 100%",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "unavail")
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("150%"))
			return md
		},
		want: `spec.strategy.rollingUpdate.maxUnavailable: Invalid value: "150%": ` + maxUnavailableMsg,
	},
	{
		name: "MachineDeployment with a negative maxUnavailable",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "overfull")
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(-2))
			return md
		},
		want: "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: -2: " + maxUnavailableMsg,
	},
	{
		name: "MachineDeployment with an unknown strategy type",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "bluegreen")
			md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: "BlueGreen"}
			return md
		},
		want: schemaErr(`spec.strategy.type: Unsupported value: "BlueGreen": supported values: "RollingUpdate", "Recreate", "OnDelete", "InPlace"`),
	},
	{
		name: "MachineDeployment with inPlace under the RollingUpdate strategy",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "inplace-rolling")
			md.Spec.Strategy.RollingUpdate = nil
			md.Spec.Strategy.InPlace = &machinistv1.InPlaceUpdate{MaxUnavailable: ptr.To(intstr.FromInt32(2))}
			return md
		},
		want: "spec.strategy: Invalid value: inPlace may only be set when the strategy type is InPlace",
	},
	{
		name: "MachineDeployment with an in-place maxUnavailable of zero",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "inplace-zero")
			md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
				InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
			return md
		},
		want: "spec.strategy.inPlace.maxUnavailable: Invalid value: 0: " + inPlaceUnavailMsg,
	},
	{
		name: "MachineDeployment with an in-place maxUnavailable of 0%",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "inplace-zero-percent")
			md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
				InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: ptr.To(intstr.FromString("0%"))}}
			return md
		},
		want: `spec.strategy.inPlace.maxUnavailable: Invalid value: "0%": ` + inPlaceUnavailMsg,
	},
	{
		name: "MachineDeployment with an unknown in-place fallback",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "inplace-fallback")
			md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
				InPlace: &machinistv1.InPlaceUpdate{Fallback: "Sometimes"}}
			return md
		},
		want: schemaErr(`spec.strategy.inPlace.fallback: Unsupported value: "Sometimes": supported values: "Never", "Replace"`),
	},
	{
		name: "MachineDeployment with rollingUpdate under the Recreate strategy",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "recreate")
			md.Spec.Strategy.Type = machinistv1.RecreateStrategy
			return md
		},
		want: "spec.strategy: Invalid value: rollingUpdate may only be set when the strategy type is RollingUpdate",
	},
	{
		name: "MachineDeployment whose progress deadline equals minReadySeconds",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "deadline")
			md.Spec.MinReadySeconds = 60
			md.Spec.ProgressDeadlineSeconds = ptr.To(int32(60))
			return md
		},
		want: "spec: Invalid value: " + deadlineMinReadyMsg,
	},
	{
		name: "MachineDeployment whose progress deadline is before minReadySeconds",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "early")
			md.Spec.MinReadySeconds = 600
			md.Spec.ProgressDeadlineSeconds = ptr.To(int32(30))
			return md
		},
		want: "spec: Invalid value: " + deadlineMinReadyMsg,
	},
	{
		name: "MachineDeployment with a zero progress deadline",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "nodeadline")
			md.Spec.ProgressDeadlineSeconds = ptr.To(int32(0))
			return md
		},
		want: "spec.progressDeadlineSeconds: Invalid value: 0: " + deadlineMsg,
	},
	{
		name: "MachineDeployment with an expireAfter shorter than a second",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "mayfly")
			md.Spec.ExpireAfter = &metav1.Duration{Duration: 500 * time.Millisecond}
			return md
		},
		want: `spec.expireAfter: Invalid value: "500ms": expireAfter must be a duration of at least 1s, such as 720h`,
	},
	{
		name: "MachineDeployment with a negative progress deadline",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "pastdeadline")
			md.Spec.ProgressDeadlineSeconds = ptr.To(int32(-30))
			return md
		},
		want: "spec.progressDeadlineSeconds: Invalid value: -30: " + deadlineMsg,
	},
	{
		name: "MachineDeployment with negative minReadySeconds",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "impatient")
			md.Spec.MinReadySeconds = -5
			return md
		},
		want: "spec.minReadySeconds: Invalid value: -5: " + minReadyMsg,
	},
	{
		name: "MachineDeployment with negative revisionHistoryLimit",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "history")
			md.Spec.RevisionHistoryLimit = ptr.To(int32(-1))
			return md
		},
		want: "spec.revisionHistoryLimit: Invalid value: -1: revisionHistoryLimit must be zero or more",
	},
	{
		// The usual way a bad version arrives: a rollout to it.
		name: "MachineDeployment rolled out to a version that is not a Kubernetes version",
		build: func(ns string) client.Object {
			return validMachineDeployment(ns, "upgrade")
		},
		update: func(o client.Object) {
			o.(*machinistv1.MachineDeployment).Spec.Template.Spec.Version = "latest"
		},
		want: `spec.template.spec.version: Invalid value: "latest": ` + versionMsg,
	},

	{
		name: "MachineDeployment whose In expression has more than 32 values",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "many")
			values := []string{"many"}
			for i := range 32 {
				values = append(values, fmt.Sprintf("v%d", i))
			}
			md.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: values},
			}
			return md
		},
		want: schemaErr("spec.selector.matchExpressions[0].values: Too many: 33: must have at most 32 items"),
	},
	{
		name: "MachineDeployment whose selector value is longer than a label value can be",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "longvalue")
			md.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpNotIn, Values: []string{strings.Repeat("v", 64)}},
			}
			return md
		},
		want: schemaErr("spec.selector.matchExpressions[0].values[0]: Too long: may not be more than 63 bytes"),
	},
	{
		name: "MachineDisruptionBudget whose NotIn expression has no values",
		build: func(ns string) client.Object {
			b := validMachineDisruptionBudget(ns, "novalues")
			b.Spec.Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpNotIn}}
			return b
		},
		want: "spec.selector.matchExpressions[0]: Invalid value: " + selectorValuesMsg,
	},
	{
		name: "MachineDrainRule whose Exists expression has values",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "existsvalues")
			r.Spec.Machines[0].Selector.MatchExpressions = []machinistv1.LabelSelectorRequirement{
				{Key: "zone", Operator: metav1.LabelSelectorOpExists, Values: []string{"a"}},
			}
			return r
		},
		want: "spec.machines[0].selector.matchExpressions[0]: Invalid value: " + selectorValuesMsg,
	},
	{
		name: "MachineDeployment template with more than 64 annotations",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "annotated")
			md.Spec.Template.Metadata.Annotations = labels(65)
			return md
		},
		want: schemaErr("spec.template.metadata.annotations: Too many: 65: must have at most 64 items"),
	},
	{
		// Written as YAML would be: the Go type always sends a selector.
		name: "MachineDeployment without a selector",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineDeployment",
				"metadata":   map[string]any{"namespace": ns, "name": "unselective"},
				"spec": map[string]any{
					"template": map[string]any{
						"metadata": map[string]any{"labels": map[string]any{"pool": "unselective"}},
						"spec":     map[string]any{"classRef": map[string]any{"name": "small"}},
					},
				},
			}}
		},
		want: schemaErr("spec.selector: Required value"),
	},

	// Machine.
	{
		name: "Machine without a class name",
		build: func(ns string) client.Object {
			m := validMachine(ns, "classless")
			m.Spec.ClassRef.Name = ""
			return m
		},
		want: "spec.classRef: Invalid value: classRef.name is required: name the MachineClass this Machine is built from",
	},
	{
		name: "Machine whose class name is too long",
		build: func(ns string) client.Object {
			m := validMachine(ns, "classy")
			m.Spec.ClassRef.Name = strings.Repeat("c", 254)
			return m
		},
		want: schemaErr("spec.classRef.name: Too long: may not be more than 253 bytes"),
	},
	{
		name: "Machine whose version is not a version",
		build: func(ns string) client.Object {
			m := validMachine(ns, "fruit")
			m.Spec.Version = "banana"
			return m
		},
		want: `spec.version: Invalid value: "banana": ` + versionMsg,
	},
	{
		name: "Machine whose version lacks the v",
		build: func(ns string) client.Object {
			m := validMachine(ns, "bare")
			m.Spec.Version = "1.37.2"
			return m
		},
		want: `spec.version: Invalid value: "1.37.2": ` + versionMsg,
	},
	{
		name: "Machine whose version lacks the patch number",
		build: func(ns string) client.Object {
			m := validMachine(ns, "minor")
			m.Spec.Version = "v1.37"
			return m
		},
		want: `spec.version: Invalid value: "v1.37": ` + versionMsg,
	},
	{
		name: "Machine whose version has an empty pre-release",
		build: func(ns string) client.Object {
			m := validMachine(ns, "dash")
			m.Spec.Version = "v1.37.2-"
			return m
		},
		want: `spec.version: Invalid value: "v1.37.2-": ` + versionMsg,
	},
	{
		name: "Machine whose version is too long",
		build: func(ns string) client.Object {
			m := validMachine(ns, "verbose")
			// Well formed, so only the length is wrong.
			m.Spec.Version = "v1.37.2-" + strings.Repeat("a", 57)
			return m
		},
		want: schemaErr("spec.version: Too long: may not be more than 64 bytes"),
	},
	{
		name: "Machine whose providerID changes",
		build: func(ns string) client.Object {
			m := validMachine(ns, "adopted")
			m.Spec.ProviderID = "inmemory:///one"
			return m
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ProviderID = "inmemory:///two" },
		want:   `spec.providerID: Invalid value: "inmemory:///two": providerID is immutable once set: delete the Machine and create a new one to use another instance`,
	},
	{
		name: "Machine whose providerID is removed",
		build: func(ns string) client.Object {
			m := validMachine(ns, "unadopted")
			m.Spec.ProviderID = "inmemory:///one"
			return m
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ProviderID = "" },
		want:   "spec: Invalid value: providerID cannot be removed once set",
	},
	{
		// Added later it would be ignored: the instance was chosen as the
		// Machine was provisioned.
		name:   "Machine given a providerID after it was created",
		build:  func(ns string) client.Object { return validMachine(ns, "lateadopter") },
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ProviderID = "inmemory:///one" },
		want:   "spec: Invalid value: " + lateProviderIDMsg,
	},
	{
		name: "Machine whose providerID is too long",
		build: func(ns string) client.Object {
			m := validMachine(ns, "longid")
			m.Spec.ProviderID = "inmemory:///" + strings.Repeat("i", 501)
			return m
		},
		want: schemaErr("spec.providerID: Too long: may not be more than 512 bytes"),
	},
	{
		name: "Machine that names a cluster in another namespace",
		build: func(ns string) client.Object {
			return machineInCluster(ns, "elsewhere", "fleet/prod")
		},
		want: `spec.clusterName: Invalid value: "fleet/prod": ` + clusterNamespaceMsg,
	},
	{
		name: "Machine whose clusterName has upper-case letters",
		build: func(ns string) client.Object {
			return machineInCluster(ns, "shouting", "Prod")
		},
		want: `spec.clusterName: Invalid value: "Prod": ` + clusterNameMsg,
	},
	{
		name: "Machine whose clusterName ends with a dash",
		build: func(ns string) client.Object {
			return machineInCluster(ns, "dangling", "prod-")
		},
		want: `spec.clusterName: Invalid value: "prod-": ` + clusterNameMsg,
	},
	{
		name: "Machine whose clusterName is too long",
		build: func(ns string) client.Object {
			// Well formed, so only the length is wrong.
			return machineInCluster(ns, "long-cluster", strings.Repeat("c", 254))
		},
		want: schemaErr("spec.clusterName: Too long: may not be more than 253 bytes"),
	},
	{
		name: "Machine whose clusterName changes",
		build: func(ns string) client.Object {
			return machineInCluster(ns, "mover", "prod")
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ClusterName = "staging" },
		want:   "spec.clusterName: Invalid value: " + clusterImmutableMsg,
	},
	{
		name: "Machine given a clusterName after creation",
		build: func(ns string) client.Object {
			return validMachine(ns, "local")
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ClusterName = "prod" },
		want:   "spec.clusterName: Invalid value: " + clusterImmutableMsg,
	},
	{
		name: "Machine whose clusterName is removed",
		build: func(ns string) client.Object {
			return machineInCluster(ns, "homesick", "prod")
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ClusterName = "" },
		want:   "spec.clusterName: Invalid value: " + clusterImmutableMsg,
	},
	{
		name: "Machine with a taint of unknown effect",
		build: func(ns string) client.Object {
			m := validMachine(ns, "tainted")
			m.Spec.NodeTaints = machinistv1.NodeTaints{{Key: "dedicated", Effect: "NoEntry"}}
			return m
		},
		want: "spec.nodeTaints: Invalid value: " + taintEffectMsg,
	},
	{
		name: "Machine with a taint that has no key",
		build: func(ns string) client.Object {
			m := validMachine(ns, "keyless")
			m.Spec.NodeTaints = machinistv1.NodeTaints{{Effect: corev1.TaintEffectNoExecute}}
			return m
		},
		want: "spec.nodeTaints: Invalid value: " + taintKeyMsg,
	},
	{
		// A metav1.Duration cannot hold a malformed value, so this object is
		// written as a user's YAML would be: unstructured.
		name: "Machine with a malformed drain timeout",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "drain"},
				"spec": map[string]any{
					"classRef": map[string]any{"name": "small"},
					"drain":    map[string]any{"timeout": "soon"},
				},
			}}
		},
		want: `spec.drain.timeout: Invalid value: "soon": ` + drainTimeoutMsg,
	},
	{
		name: "Machine with a negative drain grace period",
		build: func(ns string) client.Object {
			m := validMachine(ns, "grace")
			m.Spec.Drain = &machinistv1.DrainSettings{GracePeriodSeconds: ptr.To(int64(-1))}
			return m
		},
		want: "spec.drain.gracePeriodSeconds: Invalid value: -1: " + drainGraceMsg,
	},
	{
		name: "MachineClass with a malformed volume-detach timeout",
		build: func(ns string) client.Object {
			c := validMachineClass(ns, "volumes")
			c.Spec.Drain = &machinistv1.DrainSettings{VolumeDetachTimeout: &metav1.Duration{Duration: -time.Minute}}
			return c
		},
		want: `spec.drain.volumeDetachTimeout: Invalid value: "-1m0s": ` + volumeDetachMsg,
	},
	{
		name: "Machine with a malformed node-deletion timeout",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "node-deletion"},
				"spec": map[string]any{
					"classRef": map[string]any{"name": "small"},
					"drain":    map[string]any{"nodeDeletionTimeout": "10"},
				},
			}}
		},
		want: `spec.drain.nodeDeletionTimeout: Invalid value: "10": ` + nodeDeletionMsg,
	},
	{
		name: "MachineDrainRule that orders pods it skips",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "skip-ordered")
			r.Spec.Drain = machinistv1.MachineDrainRuleDrain{Behavior: machinistv1.DrainBehaviorSkip, Order: ptr.To[int32](5)}
			return r
		},
		want: "spec.drain: Invalid value: " + ruleOrderMsg,
	},
	{
		name: "MachineDrainRule with an unknown behavior",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "evict")
			r.Spec.Drain.Behavior = "Evict"
			return r
		},
		want: schemaErr(`spec.drain.behavior: Unsupported value: "Evict": supported values: "Drain", "Skip", "WaitCompleted"`),
	},
	{
		name: "MachineDrainRule with an order out of bounds",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "far")
			r.Spec.Drain.Order = ptr.To[int32](2000000)
			return r
		},
		want: "spec.drain.order: Invalid value: 2000000: spec.drain.order in body should be less than or equal to 1000000",
	},
	{
		name: "MachineDrainRule with a pods entry that selects nothing in particular",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "empty-entry")
			r.Spec.Pods = append(r.Spec.Pods, machinistv1.MachineDrainRulePodSelector{})
			return r
		},
		want: "spec.pods: Invalid value: " + rulePodsEntryMsg,
	},
	{
		name: "MachineDrainRule that lists a pods entry twice",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "pods-twice")
			r.Spec.Pods = append(r.Spec.Pods, r.Spec.Pods[0])
			return r
		},
		want: "spec.pods: Invalid value: " + rulePodsOnceMsg,
	},
	{
		name: "MachineDrainRule that lists a machines entry twice",
		build: func(ns string) client.Object {
			r := validMachineDrainRule(ns, "machines-twice")
			r.Spec.Machines = append(r.Spec.Machines, r.Spec.Machines[0])
			return r
		},
		want: "spec.machines: Invalid value: " + ruleMachinesOnceMsg,
	},
	{
		name: "MachineDrainRule without a drain",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineDrainRule",
				"metadata":   map[string]any{"namespace": ns, "name": "nothing"},
				"spec":       map[string]any{"pods": []any{map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "db"}}}}},
			}}
		},
		want: schemaErr(`spec.drain: Required value`),
	},

	{
		name: "Machine with more than 64 taints",
		build: func(ns string) client.Object {
			m := validMachine(ns, "smothered")
			for i := range 65 {
				m.Spec.NodeTaints = append(m.Spec.NodeTaints, corev1.Taint{Key: fmt.Sprintf("t%d", i), Effect: corev1.TaintEffectNoSchedule})
			}
			return m
		},
		want: schemaErr("spec.nodeTaints: Too many: 65: must have at most 64 items"),
	},
	{
		name: "Machine with a drain timeout longer than 32 characters",
		// Well formed, so only the length is wrong; metav1.Duration would
		// spell it shorter, so it is written as YAML would be.
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "patient"},
				"spec": map[string]any{
					"classRef": map[string]any{"name": "small"},
					"drain":    map[string]any{"timeout": strings.Repeat("1m", 17)},
				},
			}}
		},
		want: schemaErr("spec.drain.timeout: Too long: may not be more than 32 bytes"),
	},
	{
		// Written as YAML would be: the Go type always sends classRef.
		name: "Machine without a classRef",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "orphan"},
				"spec":       map[string]any{"version": "v1.37.2"},
			}}
		},
		want: schemaErr("spec.classRef: Required value"),
	},

	{
		// A metav1.Time cannot hold a malformed value, so this object is
		// written as YAML would be.
		name: "Machine with a taint added at a time that is not a time",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "when"},
				"spec": map[string]any{
					"classRef":   map[string]any{"name": "small"},
					"nodeTaints": []any{map[string]any{"key": "a", "effect": "NoSchedule", "timeAdded": "yesterday"}},
				},
			}}
		},
		want: schemaErr(`spec.nodeTaints[0].timeAdded: Invalid value: "yesterday": spec.nodeTaints[0].timeAdded in body must be of type date-time: "yesterday"`),
	},

	{
		name: "Machine without a spec",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "nothing"},
			}}
		},
		want: schemaErr("spec: Required value"),
	},
	{
		name: "Machine with a taint written without an effect",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "Machine",
				"metadata":   map[string]any{"namespace": ns, "name": "vague"},
				"spec": map[string]any{
					"classRef":   map[string]any{"name": "small"},
					"nodeTaints": []any{map[string]any{"key": "dedicated"}},
				},
			}}
		},
		want: schemaErr("spec.nodeTaints[0].effect: Required value"),
	},

	// MachineClass.
	{
		name: "MachineClass with a taint that has no key",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "keyless")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Taints: machinistv1.NodeTaints{{Effect: corev1.TaintEffectNoSchedule}}}
			return mc
		},
		want: "spec.nodeTemplate.taints: Invalid value: " + taintKeyMsg,
	},
	{
		name: "MachineClass with a taint of unknown effect",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "tainted")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Taints: machinistv1.NodeTaints{{Key: "gpu", Effect: "Prefer"}}}
			return mc
		},
		want: "spec.nodeTemplate.taints: Invalid value: " + taintEffectMsg,
	},
	{
		name: "MachineClass without a provider",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "noprovider")
			mc.Spec.Provider = ""
			return mc
		},
		want: `spec.provider: Invalid value: "": provider is required: name the actuator that builds these Machines, for example inmemory or process`,
	},
	{
		name: "MachineClass written without a provider",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineClass",
				"metadata":   map[string]any{"namespace": ns, "name": "unbuilt"},
				"spec":       map[string]any{},
			}}
		},
		want: schemaErr("spec.provider: Required value"),
	},
	{
		name: "MachineClass whose provider is too long",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "longprovider")
			mc.Spec.Provider = strings.Repeat("p", 64)
			return mc
		},
		want: schemaErr("spec.provider: Too long: may not be more than 63 bytes"),
	},
	{
		name: "MachineClass with a negative drain grace period",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "grace")
			mc.Spec.Drain = &machinistv1.DrainSettings{GracePeriodSeconds: ptr.To(int64(-5))}
			return mc
		},
		want: "spec.drain.gracePeriodSeconds: Invalid value: -5: " + drainGraceMsg,
	},
	{
		name: "MachineClass with a negative drain timeout",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineClass",
				"metadata":   map[string]any{"namespace": ns, "name": "backwards"},
				"spec": map[string]any{
					"provider": "inmemory",
					"drain":    map[string]any{"timeout": "-5m"},
				},
			}}
		},
		want: `spec.drain.timeout: Invalid value: "-5m": ` + drainTimeoutMsg,
	},
	{
		// Written as YAML would be: the Go type always sends a key, if empty.
		name: "MachineClass with a taint written without a key",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineClass",
				"metadata":   map[string]any{"namespace": ns, "name": "nokey"},
				"spec": map[string]any{
					"provider":     "inmemory",
					"nodeTemplate": map[string]any{"taints": []any{map[string]any{"effect": "NoSchedule"}}},
				},
			}}
		},
		want: schemaErr("spec.nodeTemplate.taints[0].key: Required value"),
	},
	{
		// A resource.Quantity cannot hold a malformed value, so this object
		// is written as YAML would be.
		name: "MachineClass whose capacity is not a quantity",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineClass",
				"metadata":   map[string]any{"namespace": ns, "name": "roomy"},
				"spec": map[string]any{
					"provider":     "inmemory",
					"nodeTemplate": map[string]any{"capacity": map[string]any{"cpu": "lots"}},
				},
			}}
		},
		want: `spec.nodeTemplate.capacity.cpu: Invalid value: "lots": spec.nodeTemplate.capacity.cpu in body should match '^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$'`,
	},
	{
		// A provider hands the keys on to the machine: the qemu provider's
		// kernel command line splits this one into a resource and a flag.
		name: "MachineClass with a capacity key that has a space",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "spaced")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{
				"cpu":                              resource.MustParse("2"),
				"example.com/gpu --node-name=evil": resource.MustParse("1"),
			}}
			return mc
		},
		want: "spec.nodeTemplate.capacity: Invalid value: " + capacityKeyMsg,
	},
	{
		name: "MachineClass with a capacity key that lists two resources",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "listed")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{"cpu=64,memory": resource.MustParse("1Ti")}}
			return mc
		},
		want: "spec.nodeTemplate.capacity: Invalid value: " + capacityKeyMsg,
	},
	{
		name: "MachineClass with a capacity key whose name is longer than 63 characters",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "longname")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{
				corev1.ResourceName("example.com/" + strings.Repeat("g", 64)): resource.MustParse("1"),
			}}
			return mc
		},
		want: "spec.nodeTemplate.capacity: Invalid value: " + capacityKeyMsg,
	},
	{
		name: "MachineClass with an empty capacity key",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "unnamed")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: corev1.ResourceList{"": resource.MustParse("1")}}
			return mc
		},
		want: "spec.nodeTemplate.capacity: Invalid value: " + capacityKeyMsg,
	},

	// MachineHealthCheck.
	{
		name: "MachineHealthCheck whose ladder has Replace before another rung",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "early-replace")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReplace, "", ""),
				rung(machinistv1.RemediateReboot, "", "5m"),
			}
			return hc
		},
		want: "spec.remediation.ladder: Invalid value: " + replaceLastMsg,
	},
	{
		name: "MachineHealthCheck whose ladder has two Replace rungs",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "twice")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "", "5m"),
				rung(machinistv1.RemediateReplace, "", ""),
				rung(machinistv1.RemediateReplace, "", ""),
			}
			return hc
		},
		want: "spec.remediation.ladder: Invalid value: " + replaceLastMsg,
	},
	{
		name: "MachineHealthCheck with a mode on a Repair rung",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "hard-repair")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateRepair, "hard", "15m"),
				rung(machinistv1.RemediateReplace, "", ""),
			}
			return hc
		},
		want: "spec.remediation.ladder[0]: Invalid value: " + rungModeMsg,
	},
	{
		name: "MachineHealthCheck with a mode on a Replace rung",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "soft-replace")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "", "5m"),
				rung(machinistv1.RemediateReplace, "soft", ""),
			}
			return hc
		},
		want: "spec.remediation.ladder[1]: Invalid value: " + rungModeMsg,
	},
	{
		name: "MachineHealthCheck with a Reboot rung without a timeout",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "endless-reboot")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "hard", ""),
				rung(machinistv1.RemediateReplace, "", ""),
			}
			return hc
		},
		want: "spec.remediation.ladder[0]: Invalid value: " + rungTimeoutNeededMsg,
	},
	{
		name: "MachineHealthCheck with a Repair rung without a timeout",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "endless-repair")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "", "5m"),
				rung(machinistv1.RemediateRepair, "", ""),
			}
			return hc
		},
		want: "spec.remediation.ladder[1]: Invalid value: " + rungTimeoutNeededMsg,
	},
	{
		name: "MachineHealthCheck with a Replace rung that has a timeout",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "timed-replace")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				rung(machinistv1.RemediateReboot, "", "5m"),
				rung(machinistv1.RemediateReplace, "", "10m"),
			}
			return hc
		},
		want: "spec.remediation.ladder[1]: Invalid value: " + replaceTimeoutMsg,
	},
	{
		name: "MachineHealthCheck with a rung timeout of 0s",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "instant")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{
				{Action: machinistv1.RemediateReboot, Timeout: &metav1.Duration{}},
			}
			return hc
		},
		want: `spec.remediation.ladder[0].timeout: Invalid value: "0s": ` + rungTimeoutMsg,
	},
	{
		name: "MachineHealthCheck with a rung timeout under a second",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "hasty")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{rung(machinistv1.RemediateRepair, "", "999ms")}
			return hc
		},
		want: `spec.remediation.ladder[0].timeout: Invalid value: "999ms": ` + rungTimeoutMsg,
	},
	{
		name: "MachineHealthCheck with a rung timeout of 5 minutes in words",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "wordy", map[string]any{"remediation": map[string]any{
				"ladder": []any{map[string]any{"action": "Reboot", "timeout": "5 minutes"}},
			}})
		},
		want: `spec.remediation.ladder[0].timeout: Invalid value: "5 minutes": ` + rungTimeoutMsg,
	},
	{
		name: "MachineHealthCheck with a negative rung timeout",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "rewind", map[string]any{"remediation": map[string]any{
				"ladder": []any{map[string]any{"action": "Reboot", "timeout": "-5m"}},
			}})
		},
		want: `spec.remediation.ladder[0].timeout: Invalid value: "-5m": ` + rungTimeoutMsg,
	},
	{
		// Written as YAML would be: omitempty drops an empty ladder, and
		// the server then applies the default one.
		name: "MachineHealthCheck with an empty ladder",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "no-rungs", map[string]any{"remediation": map[string]any{"ladder": []any{}}})
		},
		want: "spec.remediation.ladder: Invalid value: 0: spec.remediation.ladder in body should have at least 1 items",
	},
	{
		name: "MachineHealthCheck with a ladder of more than 8 rungs",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "tall")
			for range 9 {
				hc.Spec.Remediation.Ladder = append(hc.Spec.Remediation.Ladder, rung(machinistv1.RemediateReboot, "", "1m"))
			}
			return hc
		},
		want: schemaErr("spec.remediation.ladder: Too many: 9: must have at most 8 items"),
	},
	{
		name: "MachineHealthCheck with a rung of unknown action",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "pray")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{rung("Pray", "", "1h")}
			return hc
		},
		want: schemaErr(`spec.remediation.ladder[0].action: Unsupported value: "Pray": supported values: "Reboot", "Repair", "Replace"`),
	},
	{
		name: "MachineHealthCheck with a Reboot rung of unknown mode",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "gentle")
			hc.Spec.Remediation.Ladder = []machinistv1.Rung{rung(machinistv1.RemediateReboot, "gentle", "5m")}
			return hc
		},
		want: schemaErr(`spec.remediation.ladder[0].mode: Unsupported value: "gentle": supported values: "soft", "hard"`),
	},
	{
		// Written as YAML would be: the Go type always sends an action.
		name: "MachineHealthCheck with a rung written without an action",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "idle", map[string]any{"remediation": map[string]any{
				"ladder": []any{map[string]any{"timeout": "5m"}},
			}})
		},
		want: schemaErr("spec.remediation.ladder[0].action: Required value"),
	},
	{
		name: "MachineHealthCheck with maxInFlight 0",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "grounded")
			hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromInt32(0))
			return hc
		},
		want: "spec.remediation.maxInFlight: Invalid value: 0: " + maxInFlightMsg,
	},
	{
		name: "MachineHealthCheck with maxInFlight 0%",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "grounded-percent")
			hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("0%"))
			return hc
		},
		want: `spec.remediation.maxInFlight: Invalid value: "0%": ` + maxInFlightMsg,
	},
	{
		name: "MachineHealthCheck with maxInFlight over 100%",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "overflight")
			hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("150%"))
			return hc
		},
		want: `spec.remediation.maxInFlight: Invalid value: "150%": ` + maxInFlightMsg,
	},
	{
		name: "MachineHealthCheck with maxInFlight a number written as a string",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "quoted")
			hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("2"))
			return hc
		},
		want: `spec.remediation.maxInFlight: Invalid value: "2": ` + maxInFlightMsg,
	},
	{
		name: "MachineHealthCheck with maxUnhealthy over 100%",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "overwhelmed")
			hc.Spec.MaxUnhealthy = ptr.To(intstr.FromString("101%"))
			return hc
		},
		want: `spec.maxUnhealthy: Invalid value: "101%": ` + maxUnhealthyMsg,
	},
	{
		name: "MachineHealthCheck with a negative maxUnhealthy",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "pessimist")
			hc.Spec.MaxUnhealthy = ptr.To(intstr.FromInt32(-1))
			return hc
		},
		want: "spec.maxUnhealthy: Invalid value: -1: " + maxUnhealthyMsg,
	},
	{
		name: "MachineHealthCheck with a Node condition of status Maybe",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "unsure")
			hc.Spec.UnhealthyNodeConditions = []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Maybe", Timeout: metav1.Duration{Duration: time.Minute}},
			}
			return hc
		},
		want: schemaErr(`spec.unhealthyNodeConditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown"`),
	},
	{
		name: "MachineHealthCheck with a Node condition of empty type",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "typeless")
			hc.Spec.UnhealthyNodeConditions = []machinistv1.UnhealthyNodeCondition{
				{Type: "", Status: "False", Timeout: metav1.Duration{Duration: time.Minute}},
			}
			return hc
		},
		want: `spec.unhealthyNodeConditions[0].type: Invalid value: "": spec.unhealthyNodeConditions[0].type in body should be at least 1 chars long`,
	},
	{
		name: "MachineHealthCheck with a Node condition type longer than a condition type can be",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "verbose")
			hc.Spec.UnhealthyNodeConditions = []machinistv1.UnhealthyNodeCondition{
				{Type: strings.Repeat("t", 317), Status: "True", Timeout: metav1.Duration{Duration: time.Minute}},
			}
			return hc
		},
		want: schemaErr("spec.unhealthyNodeConditions[0].type: Too long: may not be more than 316 bytes"),
	},
	{
		name: "MachineHealthCheck with a Node condition whose timeout is not a duration",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "sixty", map[string]any{"unhealthyNodeConditions": []any{
				map[string]any{"type": "Ready", "status": "False", "timeout": "sixty seconds"},
			}})
		},
		want: `spec.unhealthyNodeConditions[0].timeout: Invalid value: "sixty seconds": ` + conditionTimeoutMsg,
	},
	{
		// Written as YAML would be: the Go type always sends a timeout.
		name: "MachineHealthCheck with a Node condition written without a timeout",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "forever", map[string]any{"unhealthyNodeConditions": []any{
				map[string]any{"type": "Ready", "status": "False"},
			}})
		},
		want: schemaErr("spec.unhealthyNodeConditions[0].timeout: Required value"),
	},
	{
		// Written as YAML would be: the Go type always sends a type and
		// a status.
		name: "MachineHealthCheck with a Node condition written without a type",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "nameless", map[string]any{"unhealthyNodeConditions": []any{
				map[string]any{"status": "False", "timeout": "1m"},
			}})
		},
		want: schemaErr("spec.unhealthyNodeConditions[0].type: Required value"),
	},
	{
		name: "MachineHealthCheck with a Node condition written without a status",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "statusless", map[string]any{"unhealthyNodeConditions": []any{
				map[string]any{"type": "Ready", "timeout": "1m"},
			}})
		},
		want: schemaErr("spec.unhealthyNodeConditions[0].status: Required value"),
	},
	{
		name: "MachineHealthCheck with more than 16 Node conditions",
		build: func(ns string) client.Object {
			hc := validMachineHealthCheck(ns, "fussy")
			for i := range 17 {
				hc.Spec.UnhealthyNodeConditions = append(hc.Spec.UnhealthyNodeConditions, machinistv1.UnhealthyNodeCondition{
					Type: fmt.Sprintf("Problem%d", i), Status: "True", Timeout: metav1.Duration{Duration: time.Minute},
				})
			}
			return hc
		},
		want: schemaErr("spec.unhealthyNodeConditions: Too many: 17: must have at most 16 items"),
	},
	{
		name: "MachineHealthCheck with a nodeStartupTimeout in words",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "slow-start", map[string]any{"nodeStartupTimeout": "ten minutes"})
		},
		want: `spec.nodeStartupTimeout: Invalid value: "ten minutes": ` + nodeStartupMsg,
	},
	{
		// Longer than Go's time.Duration can hold: it would be stored and
		// then fail every client that reads it.
		name: "MachineHealthCheck with a nodeStartupTimeout too long to read back",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "forever", map[string]any{"nodeStartupTimeout": "9999999999999h"})
		},
		want: `spec.nodeStartupTimeout: Invalid value: "9999999999999h": ` + nodeStartupMsg,
	},
	{
		// Go reads a bare 0 as a duration; the rule wants a unit.
		name: "MachineHealthCheck with a nodeStartupTimeout of 0 without a unit",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "unitless", map[string]any{"nodeStartupTimeout": "0"})
		},
		want: `spec.nodeStartupTimeout: Invalid value: "0": ` + nodeStartupMsg,
	},
	{
		name: "MachineHealthCheck with a negative cooldown",
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "backwards", map[string]any{"remediation": map[string]any{"cooldown": "-5m"}})
		},
		want: `spec.remediation.cooldown: Invalid value: "-5m": ` + cooldownMsg,
	},
	{
		name: "MachineHealthCheck with a cooldown longer than 32 characters",
		// Well formed, so only the length is wrong.
		build: func(ns string) client.Object {
			return healthCheckYAML(ns, "long-cooldown", map[string]any{"remediation": map[string]any{"cooldown": strings.Repeat("1m", 17)}})
		},
		want: schemaErr("spec.remediation.cooldown: Too long: may not be more than 32 bytes"),
	},
	{
		// Written as YAML would be: the Go type always sends a selector.
		name: "MachineHealthCheck without a selector",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": machinistv1.GroupVersion.String(),
				"kind":       "MachineHealthCheck",
				"metadata":   map[string]any{"namespace": ns, "name": "unselective"},
				"spec":       map[string]any{"maxUnhealthy": "40%"},
			}}
		},
		want: schemaErr("spec.selector: Required value"),
	},
	{
		name: "MachineHealthCheck changed to a ladder that starts with Replace",
		build: func(ns string) client.Object {
			return validMachineHealthCheck(ns, "reordered")
		},
		update: func(o client.Object) {
			hc := o.(*machinistv1.MachineHealthCheck)
			hc.Spec.Remediation.Ladder = append([]machinistv1.Rung{rung(machinistv1.RemediateReplace, "", "")}, hc.Spec.Remediation.Ladder[:2]...)
		},
		want: "spec.remediation.ladder: Invalid value: " + replaceLastMsg,
	},

	// MachineDisruptionBudget.
	{
		name: "MachineDisruptionBudget with a negative maxDisrupted",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "negative")
			mdb.Spec.MaxDisrupted = intstr.FromInt32(-1)
			return mdb
		},
		want: "spec.maxDisrupted: Invalid value: -1: " + maxDisruptedMsg,
	},
	{
		name: "MachineDisruptionBudget with maxDisrupted over 100%",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "overfull")
			mdb.Spec.MaxDisrupted = intstr.FromString("101%")
			return mdb
		},
		want: `spec.maxDisrupted: Invalid value: "101%": ` + maxDisruptedMsg,
	},
	{
		name: "MachineDisruptionBudget with maxDisrupted in words",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "wordy")
			mdb.Spec.MaxDisrupted = intstr.FromString("two")
			return mdb
		},
		want: `spec.maxDisrupted: Invalid value: "two": ` + maxDisruptedMsg,
	},
	{
		name: "MachineDisruptionBudget with maxDisrupted a number written as a string",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "quoted")
			mdb.Spec.MaxDisrupted = intstr.FromString("2")
			return mdb
		},
		want: `spec.maxDisrupted: Invalid value: "2": ` + maxDisruptedMsg,
	},
	{
		name: "MachineDisruptionBudget with a maxDisrupted percentage with a leading zero",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "padded")
			mdb.Spec.MaxDisrupted = intstr.FromString("05%")
			return mdb
		},
		want: `spec.maxDisrupted: Invalid value: "05%": ` + maxDisruptedMsg,
	},
	{
		// Written as YAML would be: the Go type always sends maxDisrupted.
		name: "MachineDisruptionBudget without maxDisrupted",
		build: func(ns string) client.Object {
			mdb := budgetYAML(ns, "unbounded", nil)
			unstructured.RemoveNestedField(mdb.Object, "spec", "maxDisrupted")
			return mdb
		},
		want: schemaErr("spec.maxDisrupted: Required value"),
	},
	{
		// Written as YAML would be: the Go type always sends a selector.
		name: "MachineDisruptionBudget without a selector",
		build: func(ns string) client.Object {
			mdb := budgetYAML(ns, "unselective", nil)
			unstructured.RemoveNestedField(mdb.Object, "spec", "selector")
			return mdb
		},
		want: schemaErr("spec.selector: Required value"),
	},
	{
		name: "MachineDisruptionBudget with an unknown reason",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "upgrade")
			mdb.Spec.Reasons = []machinistv1.DisruptionReason{machinistv1.DisruptionReboot, "Upgrade"}
			return mdb
		},
		want: schemaErr(`spec.reasons[1]: Unsupported value: "Upgrade": supported values: "Rollout", "InPlaceUpdate", "Reboot", "Repair", "Remediation", "Expiry"`),
	},
	{
		name: "MachineDisruptionBudget that lists a reason twice",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "twice")
			mdb.Spec.Reasons = []machinistv1.DisruptionReason{
				machinistv1.DisruptionReboot, machinistv1.DisruptionRepair, machinistv1.DisruptionReboot,
			}
			return mdb
		},
		want: "spec.reasons: Invalid value: " + reasonOnceMsg,
	},
	{
		// Six reasons exist, so seven repeat one: the count is checked
		// first and the rule does not run.
		name: "MachineDisruptionBudget with more than 6 reasons",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "every-reason")
			mdb.Spec.Reasons = []machinistv1.DisruptionReason{
				machinistv1.DisruptionRollout, machinistv1.DisruptionInPlaceUpdate, machinistv1.DisruptionReboot,
				machinistv1.DisruptionRepair, machinistv1.DisruptionRemediation, machinistv1.DisruptionExpiry,
				machinistv1.DisruptionRollout,
			}
			return mdb
		},
		want: schemaErr("spec.reasons: Too many: 7: must have at most 6 items"),
	},
	{
		name: "MachineDisruptionBudget with a schedule of four fields",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "four", window("0 2 * *", "4h", ""))
		},
		want: `spec.windows[0].schedule: Invalid value: "0 2 * *": ` + scheduleMsg,
	},
	{
		// Some crons take seconds first; this one does not.
		name: "MachineDisruptionBudget with a schedule of six fields",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "six", window("0 0 2 * * 1-5", "4h", ""))
		},
		want: `spec.windows[0].schedule: Invalid value: "0 0 2 * * 1-5": ` + scheduleMsg,
	},
	{
		name: "MachineDisruptionBudget with an unknown schedule descriptor",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "sometimes", window("@sometimes", "4h", ""))
		},
		want: `spec.windows[0].schedule: Invalid value: "@sometimes": ` + scheduleMsg,
	},
	{
		name: "MachineDisruptionBudget with an @every schedule",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "every", window("@every 6h", "1h", ""))
		},
		want: `spec.windows[0].schedule: Invalid value: "@every 6h": ` + scheduleMsg,
	},
	{
		name: "MachineDisruptionBudget whose second window has a bad schedule",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "second", window("@daily", "4h", ""), window("0 2", "4h", ""))
		},
		want: `spec.windows[1].schedule: Invalid value: "0 2": ` + scheduleMsg,
	},
	{
		name: "MachineDisruptionBudget with an empty schedule",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "unscheduled", window("", "4h", ""))
		},
		// A minimum length does not stop the rule, which refuses "" too.
		want: errs(`spec.windows[0].schedule: Invalid value: "": spec.windows[0].schedule in body should be at least 1 chars long`,
			`spec.windows[0].schedule: Invalid value: "": `+scheduleMsg),
	},
	{
		name: "MachineDisruptionBudget with a schedule longer than 128 characters",
		build: func(ns string) client.Object {
			// Five fields, so only the length is wrong.
			return budgetWithWindows(ns, "long-schedule", window("0 2 * * "+strings.Repeat("1,", 60)+"2", "4h", ""))
		},
		want: schemaErr("spec.windows[0].schedule: Too long: may not be more than 128 bytes"),
	},
	{
		name: "MachineDisruptionBudget with a window duration in words",
		build: func(ns string) client.Object {
			return budgetYAML(ns, "soon", map[string]any{"windows": []any{
				map[string]any{"schedule": "@daily", "duration": "soon"},
			}})
		},
		want: `spec.windows[0].duration: Invalid value: "soon": ` + windowDurationMsg,
	},
	{
		name: "MachineDisruptionBudget with a window duration of 0s",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "shut", window("@daily", "0s", ""))
		},
		want: `spec.windows[0].duration: Invalid value: "0s": ` + windowDurationMsg,
	},
	{
		name: "MachineDisruptionBudget with a negative window duration",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "backwards", window("@daily", "-1h", ""))
		},
		want: `spec.windows[0].duration: Invalid value: "-1h0m0s": ` + windowDurationMsg,
	},
	{
		// Go reads a bare 0 as a duration; the rule wants a unit.
		name: "MachineDisruptionBudget with a window duration of 0 without a unit",
		build: func(ns string) client.Object {
			return budgetYAML(ns, "unitless", map[string]any{"windows": []any{
				map[string]any{"schedule": "@daily", "duration": "0"},
			}})
		},
		want: `spec.windows[0].duration: Invalid value: "0": ` + windowDurationMsg,
	},
	{
		name: "MachineDisruptionBudget with a window duration longer than 32 characters",
		// Well formed, so only the length is wrong.
		build: func(ns string) client.Object {
			return budgetYAML(ns, "long-duration", map[string]any{"windows": []any{
				map[string]any{"schedule": "@daily", "duration": strings.Repeat("1m", 17)},
			}})
		},
		want: schemaErr("spec.windows[0].duration: Too long: may not be more than 32 bytes"),
	},
	{
		// Written as YAML would be: the Go type always sends a duration.
		name: "MachineDisruptionBudget with a window written without a duration",
		build: func(ns string) client.Object {
			return budgetYAML(ns, "open-ended", map[string]any{"windows": []any{
				map[string]any{"schedule": "@daily"},
			}})
		},
		want: schemaErr("spec.windows[0].duration: Required value"),
	},
	{
		name: "MachineDisruptionBudget with a time zone that is not a zone name",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "nowhere", window("@daily", "4h", "Not A/Zone!"))
		},
		want: `spec.windows[0].timeZone: Invalid value: "Not A/Zone!": ` + timeZoneMsg,
	},
	{
		name: "MachineDisruptionBudget with a time zone given as an offset",
		build: func(ns string) client.Object {
			return budgetWithWindows(ns, "offset", window("@daily", "4h", "+02:00"))
		},
		want: `spec.windows[0].timeZone: Invalid value: "+02:00": ` + timeZoneMsg,
	},
	{
		name: "MachineDisruptionBudget with a time zone longer than 64 characters",
		build: func(ns string) client.Object {
			// Well formed, so only the length is wrong.
			return budgetWithWindows(ns, "long-zone", window("@daily", "4h", "Europe/"+strings.Repeat("z", 58)))
		},
		want: schemaErr("spec.windows[0].timeZone: Too long: may not be more than 64 bytes"),
	},
	{
		name: "MachineDisruptionBudget with more than 8 windows",
		build: func(ns string) client.Object {
			mdb := validMachineDisruptionBudget(ns, "porous")
			for i := range 9 {
				mdb.Spec.Windows = append(mdb.Spec.Windows, window(fmt.Sprintf("0 %d * * *", i), "1h", ""))
			}
			return mdb
		},
		want: schemaErr("spec.windows: Too many: 9: must have at most 8 items"),
	},
	{
		name: "MachineDisruptionBudget changed to maxDisrupted over 100%",
		build: func(ns string) client.Object {
			return validMachineDisruptionBudget(ns, "raised")
		},
		update: func(o client.Object) {
			o.(*machinistv1.MachineDisruptionBudget).Spec.MaxDisrupted = intstr.FromString("200%")
		},
		want: `spec.maxDisrupted: Invalid value: "200%": ` + maxDisruptedMsg,
	},

	// WorkloadCluster.
	{
		name: "WorkloadCluster with an empty secretName",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "nameless")
			wc.Spec.Kubeconfig.SecretName = ""
			return wc
		},
		want: `spec.kubeconfig.secretName: Invalid value: "": ` + secretRequiredMsg,
	},
	{
		name: "WorkloadCluster without secretName",
		build: func(ns string) client.Object {
			return workloadClusterYAML(ns, "no-secret", map[string]any{"kubeconfig": map[string]any{"key": "value"}})
		},
		want: schemaErr("spec.kubeconfig.secretName: Required value"),
	},
	{
		name: "WorkloadCluster without kubeconfig",
		build: func(ns string) client.Object {
			return workloadClusterYAML(ns, "no-kubeconfig", map[string]any{})
		},
		want: schemaErr("spec.kubeconfig: Required value"),
	},
	{
		name: "WorkloadCluster whose Secret is in another namespace",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "elsewhere")
			wc.Spec.Kubeconfig.SecretName = "capi-system/prod-kubeconfig"
			return wc
		},
		want: `spec.kubeconfig.secretName: Invalid value: "capi-system/prod-kubeconfig": ` + secretNamespaceMsg,
	},
	{
		name: "WorkloadCluster whose secretName has an underscore",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "underscored")
			wc.Spec.Kubeconfig.SecretName = "prod_kubeconfig"
			return wc
		},
		want: `spec.kubeconfig.secretName: Invalid value: "prod_kubeconfig": ` + secretNameMsg,
	},
	{
		name: "WorkloadCluster whose secretName is too long",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "long-secret")
			wc.Spec.Kubeconfig.SecretName = strings.Repeat("s", 254)
			return wc
		},
		want: schemaErr("spec.kubeconfig.secretName: Too long: may not be more than 253 bytes"),
	},
	{
		name: "WorkloadCluster whose secretName changes to one in another namespace",
		build: func(ns string) client.Object {
			return validWorkloadCluster(ns, "repointed")
		},
		update: func(o client.Object) {
			o.(*machinistv1.WorkloadCluster).Spec.Kubeconfig.SecretName = "other/repointed-kubeconfig"
		},
		want: `spec.kubeconfig.secretName: Invalid value: "other/repointed-kubeconfig": ` + secretNamespaceMsg,
	},
	{
		name: "WorkloadCluster whose key has a slash",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "slashed-key")
			wc.Spec.Kubeconfig.Key = "admin/kubeconfig"
			return wc
		},
		want: `spec.kubeconfig.key: Invalid value: "admin/kubeconfig": ` + secretKeyMsg,
	},
	{
		name: "WorkloadCluster whose key is a dot",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "dot-key")
			wc.Spec.Kubeconfig.Key = "."
			return wc
		},
		want: `spec.kubeconfig.key: Invalid value: ".": ` + secretKeyMsg,
	},
	{
		name: "WorkloadCluster whose key starts with two dots",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "dotdot-key")
			wc.Spec.Kubeconfig.Key = "..data"
			return wc
		},
		want: `spec.kubeconfig.key: Invalid value: "..data": ` + secretKeyMsg,
	},
	{
		name: "WorkloadCluster whose key is too long",
		build: func(ns string) client.Object {
			wc := validWorkloadCluster(ns, "long-key")
			wc.Spec.Kubeconfig.Key = strings.Repeat("k", 254)
			return wc
		},
		want: schemaErr("spec.kubeconfig.key: Too long: may not be more than 253 bytes"),
	},
	{
		name:  "WorkloadCluster with an empty join server",
		build: func(ns string) client.Object { return joiningAt(ns, "join-empty", "") },
		want:  `spec.joinEndpoint.server: Invalid value: "": ` + joinRequiredMsg,
	},
	{
		name: "WorkloadCluster with a joinEndpoint but no server",
		build: func(ns string) client.Object {
			return workloadClusterYAML(ns, "join-none", map[string]any{
				"kubeconfig":   map[string]any{"secretName": "join-none-kubeconfig"},
				"joinEndpoint": map[string]any{"certificateAuthorityData": "Y2E="},
			})
		},
		want: schemaErr("spec.joinEndpoint.server: Required value"),
	},
	{
		name:  "WorkloadCluster with a join server over http",
		build: func(ns string) client.Object { return joiningAt(ns, "join-http", "http://10.0.0.10:6443") },
		want:  `spec.joinEndpoint.server: Invalid value: "http://10.0.0.10:6443": ` + joinURLMsg,
	},
	{
		name:  "WorkloadCluster with a join server that is a host and port alone",
		build: func(ns string) client.Object { return joiningAt(ns, "join-bare", "10.0.0.10:6443") },
		want:  `spec.joinEndpoint.server: Invalid value: "10.0.0.10:6443": ` + joinURLMsg,
	},
	{
		name:  "WorkloadCluster with a join server without a host",
		build: func(ns string) client.Object { return joiningAt(ns, "join-hostless", "https://:6443") },
		want:  `spec.joinEndpoint.server: Invalid value: "https://:6443": ` + joinURLMsg,
	},
	{
		name:  "WorkloadCluster with a join server with a path",
		build: func(ns string) client.Object { return joiningAt(ns, "join-path", "https://lb.example.com:6443/k8s") },
		want:  `spec.joinEndpoint.server: Invalid value: "https://lb.example.com:6443/k8s": ` + joinPathMsg,
	},
	{
		name: "WorkloadCluster with a join server with a query",
		build: func(ns string) client.Object {
			return joiningAt(ns, "join-query", "https://lb.example.com:6443?timeout=5s")
		},
		want: `spec.joinEndpoint.server: Invalid value: "https://lb.example.com:6443?timeout=5s": ` + joinPathMsg,
	},
	{
		name: "WorkloadCluster with a join server with a user",
		build: func(ns string) client.Object {
			return joiningAt(ns, "join-user", "https://admin:secret@lb.example.com:6443")
		},
		want: `spec.joinEndpoint.server: Invalid value: "https://admin:secret@lb.example.com:6443": ` + joinUserMsg,
	},
	{
		name: "WorkloadCluster whose join server changes to http",
		build: func(ns string) client.Object {
			return joiningAt(ns, "join-downgraded", "https://10.0.0.10:6443")
		},
		update: func(o client.Object) {
			o.(*machinistv1.WorkloadCluster).Spec.JoinEndpoint.Server = "http://10.0.0.10:6443"
		},
		want: `spec.joinEndpoint.server: Invalid value: "http://10.0.0.10:6443": ` + joinURLMsg,
	},
	{
		name: "WorkloadCluster whose join server is too long",
		build: func(ns string) client.Object {
			return joiningAt(ns, "join-long", "https://"+strings.Repeat("h", 2041)+".example")
		},
		want: schemaErr("spec.joinEndpoint.server: Too long: may not be more than 2048 bytes"),
	},
}

// joiningAt is a valid WorkloadCluster whose machines join at server.
func joiningAt(ns, name, server string) *machinistv1.WorkloadCluster {
	wc := validWorkloadCluster(ns, name)
	wc.Spec.JoinEndpoint = &machinistv1.JoinEndpoint{Server: server}
	return wc
}

// validCase is an object on the edge of a rule that the API server must
// accept: a rule that refuses too much is as wrong as one that refuses too
// little.
type validCase struct {
	name  string
	build func(ns string) client.Object
}

// machineWithVersion is a valid Machine written as YAML would be, so that an
// empty version reaches the server instead of being dropped by omitempty.
func machineWithVersion(ns, name, version string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": machinistv1.GroupVersion.String(),
		"kind":       "Machine",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"classRef": map[string]any{"name": "small"},
			"version":  version,
		},
	}}
}

// resourceNames are capacity keys of every form a resource name takes: a
// standard name, one with a size in it, a prefixed extended resource, and
// a name part of the most characters allowed.
var resourceNames = []corev1.ResourceName{
	"cpu", "memory", "ephemeral-storage", "pods", "hugepages-2Mi", "hugepages-1Gi",
	"nvidia.com/gpu", "example.com/Fast_NIC.v2", corev1.ResourceName("example.com/" + strings.Repeat("g", 63)),
}

// classWithCapacity gives mc a capacity with every one of resourceNames.
func classWithCapacity(mc *machinistv1.MachineClass) *machinistv1.MachineClass {
	capacity := corev1.ResourceList{}
	for _, name := range resourceNames {
		capacity[name] = resource.MustParse("2")
	}
	mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Capacity: capacity}
	return mc
}

var validCases = []validCase{
	{"MachineDrainRule at the lowest order", func(ns string) client.Object {
		r := validMachineDrainRule(ns, "lowest")
		r.Spec.Drain.Order = ptr.To[int32](-1000000)
		return r
	}},
	{"MachineDrainRule for every pod of every Machine", func(ns string) client.Object {
		r := validMachineDrainRule(ns, "everything")
		r.Spec.Machines, r.Spec.Pods = nil, nil
		r.Spec.Drain = machinistv1.MachineDrainRuleDrain{Behavior: machinistv1.DrainBehaviorWaitCompleted}
		return r
	}},
	{"MachineClass with every wait before deletion bounded", func(ns string) client.Object {
		c := validMachineClass(ns, "bounded")
		c.Spec.Drain = &machinistv1.DrainSettings{
			Timeout:             &metav1.Duration{Duration: 5 * time.Minute},
			VolumeDetachTimeout: &metav1.Duration{Duration: 90 * time.Second},
			NodeDeletionTimeout: &metav1.Duration{Duration: 0},
		}
		return c
	}},
	{"MachineClass whose capacity keys are resource names of every form", func(ns string) client.Object {
		return classWithCapacity(validMachineClass(ns, "resources"))
	}},
	{"Machine at a release", func(ns string) client.Object { return machineWithVersion(ns, "release", "v1.37.2") }},
	{"Machine at a release candidate", func(ns string) client.Object { return machineWithVersion(ns, "rc", "v1.38.0-rc.1") }},
	{"Machine at an alpha", func(ns string) client.Object { return machineWithVersion(ns, "alpha", "v1.38.0-alpha.0") }},
	{"Machine at a version with build metadata", func(ns string) client.Object { return machineWithVersion(ns, "build", "v1.37.2+k3s1") }},
	{"Machine at v0.0.0", func(ns string) client.Object { return machineWithVersion(ns, "zero", "v0.0.0") }},
	{"Machine with an empty version", func(ns string) client.Object { return machineWithVersion(ns, "empty", "") }},
	{"Machine without a version", func(ns string) client.Object {
		m := validMachine(ns, "unversioned")
		m.Spec.Version = ""
		return m
	}},
	{"MachineSet whose template runs a release candidate", func(ns string) client.Object {
		ms := validMachineSet(ns, "rc", 1)
		ms.Spec.Template.Spec.Version = "v1.38.0-rc.1"
		return ms
	}},
	{"MachineSet selected by one expression of each operator", func(ns string) client.Object {
		ms := validMachineSet(ns, "exprs", 0)
		ms.Spec.Selector = machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{
			{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"exprs", "other"}},
			{Key: "pool", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"other"}},
			{Key: "pool", Operator: metav1.LabelSelectorOpExists},
			{Key: "zone", Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: "zone", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"a"}},
		}}
		return ms
	}},
	{"MachineDeployment whose template runs an alpha", func(ns string) client.Object {
		md := validMachineDeployment(ns, "alpha")
		md.Spec.Template.Spec.Version = "v1.38.0-alpha.0"
		return md
	}},
	{"MachineDeployment with zero replicas", func(ns string) client.Object {
		md := validMachineDeployment(ns, "idle")
		md.Spec.Replicas = ptr.To(int32(0))
		return md
	}},
	{"MachineDeployment with the InPlace strategy and its defaults", func(ns string) client.Object {
		md := validMachineDeployment(ns, "inplace")
		md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy}
		return md
	}},
	{"MachineDeployment with the InPlace strategy, 100% unavailable and fallback Replace", func(ns string) client.Object {
		md := validMachineDeployment(ns, "inplace-all")
		md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
			InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: ptr.To(intstr.FromString("100%")), Fallback: machinistv1.FallbackReplace}}
		return md
	}},
	{"MachineDeployment with maxSurge 0 and maxUnavailable 1", func(ns string) client.Object {
		md := validMachineDeployment(ns, "inplace")
		md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(0))
		md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		return md
	}},
	{"MachineDeployment with maxSurge 0% and maxUnavailable 100%", func(ns string) client.Object {
		md := validMachineDeployment(ns, "percent")
		md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("0%"))
		md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("100%"))
		return md
	}},
	{"MachineDeployment whose progress deadline is one second after minReadySeconds", func(ns string) client.Object {
		md := validMachineDeployment(ns, "tight")
		md.Spec.MinReadySeconds = 59
		md.Spec.ProgressDeadlineSeconds = ptr.To(int32(60))
		return md
	}},
	{"MachineHealthCheck with every field set", func(ns string) client.Object {
		return fullMachineHealthCheck(ns, "full")
	}},
	{"MachineHealthCheck with maxInFlight 20%", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "fifth")
		hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("20%"))
		return hc
	}},
	{"MachineHealthCheck with maxInFlight 1% and maxUnhealthy 0", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "careful")
		hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("1%"))
		hc.Spec.MaxUnhealthy = ptr.To(intstr.FromInt32(0))
		return hc
	}},
	{"MachineHealthCheck with maxInFlight 100% and maxUnhealthy 0%", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "all-at-once")
		hc.Spec.Remediation.MaxInFlight = ptr.To(intstr.FromString("100%"))
		hc.Spec.MaxUnhealthy = ptr.To(intstr.FromString("0%"))
		return hc
	}},
	{"MachineHealthCheck with a hard and a soft Reboot rung before Replace", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "two-reboots")
		hc.Spec.Remediation.Ladder = []machinistv1.Rung{
			rung(machinistv1.RemediateReboot, "hard", "1m"),
			rung(machinistv1.RemediateReboot, "soft", "2m"),
			rung(machinistv1.RemediateReplace, "", ""),
		}
		return hc
	}},
	{"MachineHealthCheck whose ladder is Replace alone", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "replace-only")
		hc.Spec.Remediation.Ladder = []machinistv1.Rung{rung(machinistv1.RemediateReplace, "", "")}
		return hc
	}},
	{"MachineHealthCheck whose ladder has no Replace", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "keep")
		hc.Spec.Remediation.Ladder = []machinistv1.Rung{
			rung(machinistv1.RemediateReboot, "", "5m"),
			rung(machinistv1.RemediateRepair, "", "15m"),
		}
		return hc
	}},
	{"MachineHealthCheck with rung timeouts of 1s, 1.5h and 1h30m", func(ns string) client.Object {
		return healthCheckYAML(ns, "timeouts", map[string]any{"remediation": map[string]any{"ladder": []any{
			map[string]any{"action": "Reboot", "timeout": "1s"},
			map[string]any{"action": "Reboot", "mode": "hard", "timeout": "1.5h"},
			map[string]any{"action": "Repair", "timeout": "1h30m"},
		}}})
	}},
	{"MachineHealthCheck with a ladder of 8 rungs and 16 Node conditions", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "most")
		for range 7 {
			hc.Spec.Remediation.Ladder = append(hc.Spec.Remediation.Ladder, rung(machinistv1.RemediateReboot, "", "1m"))
		}
		hc.Spec.Remediation.Ladder = append(hc.Spec.Remediation.Ladder, rung(machinistv1.RemediateReplace, "", ""))
		for i := range 16 {
			hc.Spec.UnhealthyNodeConditions = append(hc.Spec.UnhealthyNodeConditions, machinistv1.UnhealthyNodeCondition{
				Type: fmt.Sprintf("Problem%d", i), Status: "True", Timeout: metav1.Duration{Duration: time.Minute},
			})
		}
		return hc
	}},
	{"MachineHealthCheck with nodeStartupTimeout and cooldown 0s", func(ns string) client.Object {
		return healthCheckYAML(ns, "zero", map[string]any{
			"nodeStartupTimeout": "0s",
			"remediation":        map[string]any{"cooldown": "0s"},
		})
	}},
	{"MachineHealthCheck with an empty selector", func(ns string) client.Object {
		hc := validMachineHealthCheck(ns, "everything")
		hc.Spec.Selector = metav1.LabelSelector{}
		return hc
	}},
	{"Machine serving a WorkloadCluster", func(ns string) client.Object { return machineInCluster(ns, "remote", "prod") }},
	{"Machine serving a WorkloadCluster whose name has dots", func(ns string) client.Object {
		return machineInCluster(ns, "dotted", "prod.eu-west-1.example")
	}},
	{"Machine serving a WorkloadCluster whose name is 253 bytes", func(ns string) client.Object {
		return machineInCluster(ns, "longest", strings.Repeat("c", 253))
	}},
	{"Machine with an empty clusterName", func(ns string) client.Object {
		m := machineWithVersion(ns, "own-cluster", "v1.37.2")
		m.Object["spec"].(map[string]any)["clusterName"] = ""
		return m
	}},
	{"MachineDeployment whose template serves a WorkloadCluster", func(ns string) client.Object {
		md := validMachineDeployment(ns, "remote")
		md.Spec.Template.Spec.ClusterName = "prod"
		return md
	}},
	{"WorkloadCluster reading Cluster API's Secret", func(ns string) client.Object { return validWorkloadCluster(ns, "prod") }},
	{"WorkloadCluster with an empty key", func(ns string) client.Object {
		return workloadClusterYAML(ns, "empty-key", map[string]any{"kubeconfig": map[string]any{"secretName": "prod-kubeconfig", "key": ""}})
	}},
	{"WorkloadCluster with a key of letters, digits, '-', '_' and '.'", func(ns string) client.Object {
		wc := validWorkloadCluster(ns, "keyed")
		wc.Spec.Kubeconfig.Key = "admin_kubeconfig-2.yaml"
		return wc
	}},
	{"WorkloadCluster with a key that starts with one dot", func(ns string) client.Object {
		wc := validWorkloadCluster(ns, "hidden-key")
		wc.Spec.Kubeconfig.Key = ".kubeconfig"
		return wc
	}},
	{"WorkloadCluster whose secretName has dots", func(ns string) client.Object {
		wc := validWorkloadCluster(ns, "dotted")
		wc.Spec.Kubeconfig.SecretName = "prod.kubeconfig"
		return wc
	}},
	{"WorkloadCluster joining at an address and port", func(ns string) client.Object {
		return joiningAt(ns, "join-ip", "https://10.0.0.10:6443")
	}},
	{"WorkloadCluster joining at a host name with a trailing slash, with a CA", func(ns string) client.Object {
		wc := joiningAt(ns, "join-lb", "https://api.internal.example.com/")
		wc.Spec.JoinEndpoint.CertificateAuthorityData = []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
		return wc
	}},
	{"WorkloadCluster joining at an IPv6 address", func(ns string) client.Object {
		return joiningAt(ns, "join-ipv6", "https://[fd00::10]:6443")
	}},
	{"MachineDisruptionBudget with maxDisrupted 0", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "frozen")
		mdb.Spec.MaxDisrupted = intstr.FromInt32(0)
		return mdb
	}},
	{"MachineDisruptionBudget with maxDisrupted 0%", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "frozen-percent")
		mdb.Spec.MaxDisrupted = intstr.FromString("0%")
		return mdb
	}},
	{"MachineDisruptionBudget with maxDisrupted 100%", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "all")
		mdb.Spec.MaxDisrupted = intstr.FromString("100%")
		return mdb
	}},
	{"MachineDisruptionBudget with maxDisrupted 9%", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "single-digit")
		mdb.Spec.MaxDisrupted = intstr.FromString("9%")
		return mdb
	}},
	{"MachineDisruptionBudget with an empty selector", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "everything")
		mdb.Spec.Selector = machinistv1.LabelSelector{}
		return mdb
	}},
	{"MachineDisruptionBudget with an empty list of reasons", func(ns string) client.Object {
		return budgetYAML(ns, "no-reasons", map[string]any{"reasons": []any{}})
	}},
	{"MachineDisruptionBudget with every reason once", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "every-reason")
		mdb.Spec.Reasons = []machinistv1.DisruptionReason{
			machinistv1.DisruptionRollout, machinistv1.DisruptionInPlaceUpdate, machinistv1.DisruptionReboot,
			machinistv1.DisruptionRepair, machinistv1.DisruptionRemediation, machinistv1.DisruptionExpiry,
		}
		return mdb
	}},
	{"MachineDisruptionBudget with an empty list of windows", func(ns string) client.Object {
		return budgetYAML(ns, "no-windows", map[string]any{"windows": []any{}})
	}},
	{"MachineDisruptionBudget with a window @daily for 4h in Europe/Berlin", func(ns string) client.Object {
		return budgetWithWindows(ns, "nightly", window("@daily", "4h", "Europe/Berlin"))
	}},
	{"MachineDisruptionBudget with a schedule whose fields are separated by several spaces", func(ns string) client.Object {
		return budgetWithWindows(ns, "spaced", window("0  2 *   * 1-5", "30m", ""))
	}},
	{"MachineDisruptionBudget with 8 windows, one of each descriptor", func(ns string) client.Object {
		mdb := validMachineDisruptionBudget(ns, "descriptors")
		for _, s := range []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly", "*/15 0-6 1,15 * MON-FRI"} {
			mdb.Spec.Windows = append(mdb.Spec.Windows, window(s, "10m", ""))
		}
		return mdb
	}},
	{"MachineDisruptionBudget with window durations 1ns, 1.5h and 1h30m", func(ns string) client.Object {
		return budgetYAML(ns, "durations", map[string]any{"windows": []any{
			map[string]any{"schedule": "@hourly", "duration": "1ns"},
			map[string]any{"schedule": "@daily", "duration": "1.5h"},
			map[string]any{"schedule": "@weekly", "duration": "1h30m"},
		}})
	}},
	{"MachineDisruptionBudget with time zones UTC, Etc/GMT+5 and America/Argentina/Buenos_Aires", func(ns string) client.Object {
		return budgetWithWindows(ns, "zones",
			window("@daily", "1h", "UTC"),
			window("@daily", "1h", "Etc/GMT+5"),
			window("@daily", "1h", "America/Argentina/Buenos_Aires"),
		)
	}},
}

// validUpdate is a change the API server must accept: an update of a valid
// object, and what the stored object must then hold.
type validUpdate struct {
	name   string
	build  func(ns string) client.Object
	update func(client.Object)
	check  func(stored client.Object) error
}

// templateCluster is the clusterName of a MachineSet's or
// MachineDeployment's template.
func templateCluster(o client.Object) string {
	switch o := o.(type) {
	case *machinistv1.MachineSet:
		return o.Spec.Template.Spec.ClusterName
	case *machinistv1.MachineDeployment:
		return o.Spec.Template.Spec.ClusterName
	}
	panic(fmt.Sprintf("%T has no template", o))
}

// setTemplateCluster sets the clusterName of a MachineSet's or
// MachineDeployment's template.
func setTemplateCluster(o client.Object, cluster string) {
	switch o := o.(type) {
	case *machinistv1.MachineSet:
		o.Spec.Template.Spec.ClusterName = cluster
	case *machinistv1.MachineDeployment:
		o.Spec.Template.Spec.ClusterName = cluster
	default:
		panic(fmt.Sprintf("%T has no template", o))
	}
}

// templateMovesTo is a validUpdate of a template's clusterName from one
// cluster to another: a template change like any other, which the API
// must let through for a rollout to move Machines between clusters.
func templateMovesTo(kind string, build func(ns string) client.Object, from, to string) validUpdate {
	return validUpdate{
		name: fmt.Sprintf("%s template whose clusterName goes from %q to %q", kind, from, to),
		build: func(ns string) client.Object {
			o := build(ns)
			setTemplateCluster(o, from)
			return o
		},
		update: func(o client.Object) { setTemplateCluster(o, to) },
		check: func(stored client.Object) error {
			if got := templateCluster(stored); got != to {
				return fmt.Errorf("the stored template serves %q, not %q", got, to)
			}
			return nil
		},
	}
}

var validUpdates = []validUpdate{
	templateMovesTo("MachineDeployment", func(ns string) client.Object { return validMachineDeployment(ns, "pool") }, "", "prod"),
	templateMovesTo("MachineDeployment", func(ns string) client.Object { return validMachineDeployment(ns, "pool") }, "prod", "staging"),
	templateMovesTo("MachineDeployment", func(ns string) client.Object { return validMachineDeployment(ns, "pool") }, "prod", ""),
	templateMovesTo("MachineSet", func(ns string) client.Object { return validMachineSet(ns, "workers", 1) }, "", "prod"),
	templateMovesTo("MachineSet", func(ns string) client.Object { return validMachineSet(ns, "workers", 1) }, "prod", "staging"),
	templateMovesTo("MachineSet", func(ns string) client.Object { return validMachineSet(ns, "workers", 1) }, "prod", ""),
	{
		name:  "Machine serving a WorkloadCluster whose version and labels change",
		build: func(ns string) client.Object { return machineInCluster(ns, "remote", "prod") },
		update: func(o client.Object) {
			m := o.(*machinistv1.Machine)
			m.Spec.Version = "v1.37.3"
			m.Spec.NodeLabels = map[string]string{"tier": "batch"}
		},
		check: func(stored client.Object) error {
			if m := stored.(*machinistv1.Machine); m.Spec.ClusterName != "prod" || m.Spec.Version != "v1.37.3" {
				return fmt.Errorf("the stored Machine serves %q at %s", m.Spec.ClusterName, m.Spec.Version)
			}
			return nil
		},
	},
	{
		// Absent and empty both mean the manager's own cluster.
		name:  "Machine without a clusterName given an empty one",
		build: func(ns string) client.Object { return machineWithVersion(ns, "own-cluster", "v1.37.2") },
		update: func(o client.Object) {
			o.(*unstructured.Unstructured).Object["spec"].(map[string]any)["clusterName"] = ""
		},
		// Stored at v1beta1 and read back converted, an empty clusterName
		// and none are the same field: either is right.
		check: func(stored client.Object) error {
			cluster, _, err := unstructured.NestedString(stored.(*unstructured.Unstructured).Object, "spec", "clusterName")
			if err != nil || cluster != "" {
				return fmt.Errorf("the stored clusterName is %q (%v), want an empty one", cluster, err)
			}
			return nil
		},
	},
	{
		name:  "WorkloadCluster pointed at another Secret and key",
		build: func(ns string) client.Object { return validWorkloadCluster(ns, "prod") },
		update: func(o client.Object) {
			wc := o.(*machinistv1.WorkloadCluster)
			wc.Spec.Kubeconfig = machinistv1.KubeconfigReference{SecretName: "prod-admin", Key: "kubeconfig"}
		},
		check: func(stored client.Object) error {
			if ref := stored.(*machinistv1.WorkloadCluster).Spec.Kubeconfig; ref.SecretName != "prod-admin" || ref.DataKey() != "kubeconfig" {
				return fmt.Errorf("the stored kubeconfig reference is %+v", ref)
			}
			return nil
		},
	},
}

// ruleMessages returns the message of every x-kubernetes-validations rule in
// the CRDs in dir.
func ruleMessages(dir string) map[string]bool {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	Expect(files).NotTo(BeEmpty())
	out := map[string]bool{}
	var walk func(s *apiextensionsv1.JSONSchemaProps)
	walk = func(s *apiextensionsv1.JSONSchemaProps) {
		if s == nil {
			return
		}
		for _, r := range s.XValidations {
			out[r.Message] = true
		}
		for _, p := range s.Properties {
			walk(&p)
		}
		if s.Items != nil {
			walk(s.Items.Schema)
		}
		if s.AdditionalProperties != nil {
			walk(s.AdditionalProperties.Schema)
		}
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		var crd apiextensionsv1.CustomResourceDefinition
		Expect(yaml.UnmarshalStrict(raw, &crd)).To(Succeed(), f)
		for _, v := range crd.Spec.Versions {
			walk(v.Schema.OpenAPIV3Schema)
		}
	}
	return out
}

// invalidMessage is the whole message the API server gives when it refuses
// obj for want.
func invalidMessage(obj client.Object, want string) string {
	gvk, err := apiutil.GVKForObject(obj, k8s.Scheme())
	Expect(err).NotTo(HaveOccurred())
	return fmt.Sprintf("%s %q is invalid: %s", gvk.GroupKind(), obj.GetName(), want)
}

var _ = Describe("API validation", func() {
	It("accepts the valid objects every invalid case starts from", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		for _, o := range []client.Object{
			validMachineClass(ns, "small"),
			validMachine(ns, "m"),
			validMachineSet(ns, "ms", 2),
			validMachineDeployment(ns, "md"),
			validMachineHealthCheck(ns, "mhc"),
			validMachineDisruptionBudget(ns, "mdb"),
			validMachineDrainRule(ns, "mdr"),
			validWorkloadCluster(ns, "wc"),
		} {
			Expect(k8s.Create(ctx, o)).To(Succeed(), "%T %s", o, o.GetName())
		}
	})

	It("keeps at least 40 invalid cases, with a case and a line in docs/api.md for every rule", func() {
		Expect(len(invalidCases)).To(BeNumerically(">=", minInvalidCases))
		names := map[string]bool{}
		for _, c := range invalidCases {
			Expect(c.want).NotTo(BeEmpty(), c.name)
			Expect(names).NotTo(HaveKey(c.name), "two cases are called %q", c.name)
			names[c.name] = true
		}
		docs, err := os.ReadFile(filepath.Join(env.Root, "docs", "api.md"))
		Expect(err).NotTo(HaveOccurred())
		messages := ruleMessages(filepath.Join(env.Root, "config", "crd", "bases"))
		// Every kind has rules; fewer means the CRDs were not read.
		Expect(len(messages)).To(BeNumerically(">=", 20))
		for msg := range messages {
			broken := false
			for _, c := range invalidCases {
				broken = broken || strings.Contains(c.want, ": "+msg)
			}
			for _, want := range atBeta {
				broken = broken || strings.Contains(want, ": "+msg)
			}
			for _, c := range betaCases {
				broken = broken || strings.Contains(c.want, ": "+msg)
			}
			Expect(broken).To(BeTrue(), "no invalid case breaks the rule %q", msg)
			Expect(string(docs)).To(ContainSubstring(msg), "docs/api.md does not list the rule %q", msg)
		}
	})

	entries := make([]TableEntry, 0, len(invalidCases))
	for _, c := range invalidCases {
		entries = append(entries, Entry(c.name, c))
	}
	DescribeTable("rejects an invalid object with a message a person understands",
		func(ctx SpecContext, c invalidCase) {
			ns := env.NewNamespace(GinkgoTB(), "e2e")
			obj := c.build(ns)
			var err error
			var stored string
			if c.update == nil {
				err = k8s.Create(ctx, obj)
			} else {
				Expect(k8s.Create(ctx, obj)).To(Succeed(), "the object before the update must be valid")
				stored = obj.GetResourceVersion()
				c.update(obj)
				err = k8s.Update(ctx, obj)
			}
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			// Gomega shortens long strings it compares; the description
			// keeps the whole message in a failure.
			Expect(err.Error()).To(Equal(invalidMessage(obj, c.want)), "the server said:\n%s", err)

			after := obj.DeepCopyObject().(client.Object)
			err = k8s.Get(ctx, client.ObjectKeyFromObject(obj), after)
			if c.update == nil {
				Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a refused object must not be stored, got %v", err)
			} else {
				Expect(err).NotTo(HaveOccurred())
				Expect(after.GetResourceVersion()).To(Equal(stored), "a refused update must not be stored")
			}
		},
		entries,
	)

	validEntries := make([]TableEntry, 0, len(validCases))
	for _, c := range validCases {
		validEntries = append(validEntries, Entry(c.name, c))
	}
	DescribeTable("accepts an object on the edge of a rule",
		func(ctx SpecContext, c validCase) {
			ns := env.NewNamespace(GinkgoTB(), "e2e")
			obj := c.build(ns)
			Expect(k8s.Create(ctx, obj)).To(Succeed())
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))).To(Succeed())
		},
		validEntries,
	)

	updateEntries := make([]TableEntry, 0, len(validUpdates))
	for _, c := range validUpdates {
		updateEntries = append(updateEntries, Entry(c.name, c))
	}
	DescribeTable("accepts a change no rule forbids",
		func(ctx SpecContext, c validUpdate) {
			ns := env.NewNamespace(GinkgoTB(), "e2e")
			obj := c.build(ns)
			Expect(k8s.Create(ctx, obj)).To(Succeed(), "the object before the update must be valid")
			c.update(obj)
			Expect(k8s.Update(ctx, obj)).To(Succeed())
			stored := obj.DeepCopyObject().(client.Object)
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), stored)).To(Succeed())
			Expect(c.check(stored)).To(Succeed())
		},
		updateEntries,
	)
})
