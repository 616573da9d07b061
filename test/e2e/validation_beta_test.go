package e2e

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	"github.com/machinist-dev/machinist/api/v1beta1"
)

// atBeta is what kube-apiserver says, after `<Kind>.machinist.dev "<name>"
// is invalid: `, when a v1alpha1 invalid case, converted, is sent at
// v1beta1 and v1beta1 words it otherwise: its bounds are in the message,
// its enums are schema enums, and a drain rule's behavior moved.
var atBeta = map[string]string{
	"Machine with a negative drain grace period":                                 "spec.drain.gracePeriodSeconds: Invalid value: -1: drain gracePeriodSeconds must be from 0 to 86400 (a day)",
	"Machine with a taint of unknown effect":                                     "[spec.nodeTaints[0].effect: Unsupported value: \"NoEntry\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"Machine with a taint that has no key":                                       "spec.nodeTaints[0].key: Invalid value: \"\": every taint needs a key",
	"Machine without a class name":                                               "spec.classRef.name: Invalid value: \"\": classRef.name is required: name the MachineClass this Machine is built from",
	"MachineClass with a negative drain grace period":                            "spec.drain.gracePeriodSeconds: Invalid value: -5: drain gracePeriodSeconds must be from 0 to 86400 (a day)",
	"MachineClass with a taint of unknown effect":                                "[spec.nodeTemplate.nodeTaints[0].effect: Unsupported value: \"Prefer\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineClass with a taint that has no key":                                  "spec.nodeTemplate.nodeTaints[0].key: Invalid value: \"\": every taint needs a key",
	"MachineDeployment with a malformed maxSurge":                                "spec.strategy.rollingUpdate.maxSurge: Invalid value: \"ten\": maxSurge must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDeployment with a negative maxSurge":                                 "spec.strategy.rollingUpdate.maxSurge: Invalid value: -1: maxSurge must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDeployment with a negative maxUnavailable":                           "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: -2: maxUnavailable must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDeployment with an in-place maxUnavailable of 0%":                    "spec.strategy.inPlace.maxUnavailable: Invalid value: \"0%\": maxUnavailable must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%: an in-place rollout takes each Machine out of service while it is updated",
	"MachineDeployment with an in-place maxUnavailable of zero":                  "spec.strategy.inPlace.maxUnavailable: Invalid value: 0: maxUnavailable must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%: an in-place rollout takes each Machine out of service while it is updated",
	"MachineDeployment with maxUnavailable over 100%":                            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"150%\": maxUnavailable must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget changed to maxDisrupted over 100%":                  "spec.maxDisrupted: Invalid value: \"200%\": maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget that lists a reason twice":                          "spec.reasons[2]: Duplicate value: \"Reboot\"",
	"MachineDisruptionBudget with a maxDisrupted percentage with a leading zero": "spec.maxDisrupted: Invalid value: \"05%\": maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget with a negative maxDisrupted":                       "spec.maxDisrupted: Invalid value: -1: maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget with an unknown reason":                             "[spec.reasons[1]: Unsupported value: \"Upgrade\": supported values: \"Rollout\", \"Update\", \"Reboot\", \"Repair\", \"Remediation\", \"Expiry\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineDisruptionBudget with maxDisrupted a number written as a string":     "spec.maxDisrupted: Invalid value: \"2\": maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget with maxDisrupted in words":                         "spec.maxDisrupted: Invalid value: \"two\": maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget with maxDisrupted over 100%":                        "spec.maxDisrupted: Invalid value: \"101%\": maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineDisruptionBudget with more than 6 reasons":                           "[spec.reasons: Too many: 7: must have at most 6 items, spec.reasons[6]: Duplicate value: \"Rollout\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineDrainRule that orders pods it skips":                                 "spec: Invalid value: order can be set only with behavior Drain: Skip and WaitCompleted pods are never evicted, so they have no place in the order",
	"MachineDrainRule with an order out of bounds":                               "spec.order: Invalid value: 2000000: spec.order in body should be less than or equal to 1000000",
	"MachineDrainRule with an unknown behavior":                                  "[spec.behavior: Unsupported value: \"Evict\": supported values: \"Drain\", \"Skip\", \"WaitCompleted\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineDrainRule without a drain":                                           "[spec.behavior: Required value, <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineHealthCheck with a Reboot rung of unknown mode":                      "[spec.remediation.ladder[0].mode: Unsupported value: \"gentle\": supported values: \"Soft\", \"Hard\", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
	"MachineHealthCheck with a negative maxUnhealthy":                            "spec.maxUnhealthy: Invalid value: -1: maxUnhealthy must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineHealthCheck with maxInFlight 0":                                      "spec.remediation.maxInFlight: Invalid value: 0: maxInFlight must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%",
	"MachineHealthCheck with maxInFlight 0%":                                     "spec.remediation.maxInFlight: Invalid value: \"0%\": maxInFlight must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%",
	"MachineHealthCheck with maxInFlight a number written as a string":           "spec.remediation.maxInFlight: Invalid value: \"2\": maxInFlight must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%",
	"MachineHealthCheck with maxInFlight over 100%":                              "spec.remediation.maxInFlight: Invalid value: \"150%\": maxInFlight must be a whole number of Machines (1 to 100000) or a percentage from 1% to 100%",
	"MachineHealthCheck with maxUnhealthy over 100%":                             "spec.maxUnhealthy: Invalid value: \"101%\": maxUnhealthy must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	"MachineSet with more replicas than an int32 holds":                          "[<nil>: Invalid value: \"\": Checked value must be of type integer with format int32 in spec.replicas, .spec.replicas: Invalid value: 2147483648: should be less than or equal to 2147483647, spec.replicas: Invalid value: 2147483648: replicas must be at most 100000: a larger number is more likely a typo than a fleet]",
}

// betaCase is an object only v1beta1 refuses: a bound or rule v1alpha1
// does not have. Like invalidCase, it is refused on create when update is
// nil, otherwise on the update.
type betaCase struct {
	name   string
	build  func(ns string) client.Object
	update func(client.Object)
	want   string
}

// notAtBeta are the v1alpha1 cases about a field v1beta1 does not have,
// and why; what each checks at v1alpha1 has a counterpart in betaCases
// where v1beta1 has one.
var notAtBeta = map[string]string{
	"Machine with a taint added at a time that is not a time": "v1beta1's taints have no timeAdded",
	"MachineClass with a taint written without a key":         "written as raw JSON with v1alpha1's nodeTemplate.taints; at v1beta1 it is nodeTemplate.nodeTaints (case \"MachineClass with a taint written without a key, at v1beta1\")",
}

// beta builds a valid v1beta1 object from a valid v1alpha1 one and lets
// change set what the case is about.
func beta[T client.Object](alpha client.Object, change func(T)) client.Object {
	o := toBeta(alpha).(T)
	change(o)
	return o
}

var betaCases = []betaCase{
	{
		// A kind v1alpha1 never had: its one rule is on the root.
		name: "ManagementCluster not named cluster",
		build: func(string) client.Object {
			return &v1beta1.ManagementCluster{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
		},
		want: "<nil>: Invalid value: there is one ManagementCluster, named cluster, and the manager makes it: it stands for the cluster the manager runs against",
	},
	{
		name: "MachineDeployment of 100,000,000 replicas",
		build: func(ns string) client.Object {
			return beta(validMachineDeployment(ns, "huge"), func(md *v1beta1.MachineDeployment) { md.Spec.Replicas = ptr.To[int32](100_000_000) })
		},
		want: "spec.replicas: Invalid value: 100000000: " + betaReplicasMsg,
	},
	{
		name: "MachineSet of 100,001 replicas",
		build: func(ns string) client.Object {
			return beta(validMachineSet(ns, "huge", 1), func(ms *v1beta1.MachineSet) { ms.Spec.Replicas = ptr.To[int32](100_001) })
		},
		want: "spec.replicas: Invalid value: 100001: " + betaReplicasMsg,
	},
	{
		name: "MachineSet ready only after more than an hour",
		build: func(ns string) client.Object {
			return beta(validMachineSet(ns, "slow", 1), func(ms *v1beta1.MachineSet) { ms.Spec.MinReadySeconds = 3601 })
		},
		want: "spec.minReadySeconds: Invalid value: 3601: minReadySeconds must be at most 3600 (an hour)",
	},
	{
		name: "MachineDeployment whose rollouts may take more than a day",
		build: func(ns string) client.Object {
			return beta(validMachineDeployment(ns, "patient"), func(md *v1beta1.MachineDeployment) { md.Spec.ProgressDeadlineSeconds = ptr.To[int32](86401) })
		},
		want: "spec.progressDeadlineSeconds: Invalid value: 86401: progressDeadlineSeconds must be at most 86400 (a day)",
	},
	{
		name: "MachineDeployment that keeps more than 100 old sets",
		build: func(ns string) client.Object {
			return beta(validMachineDeployment(ns, "hoarder"), func(md *v1beta1.MachineDeployment) { md.Spec.RevisionHistoryLimit = ptr.To[int32](101) })
		},
		want: "spec.revisionHistoryLimit: Invalid value: 101: revisionHistoryLimit must be at most 100",
	},
	{
		name: "MachineDeployment that surges by more than 100%",
		build: func(ns string) client.Object {
			return beta(validMachineDeployment(ns, "surge"), func(md *v1beta1.MachineDeployment) {
				md.Spec.Strategy = v1beta1.MachineDeploymentStrategy{Type: v1beta1.RollingUpdateStrategy, RollingUpdate: &v1beta1.RollingUpdate{
					MaxSurge: ptr.To(intstr.FromString("99999%")), MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				}}
			})
		},
		want: `spec.strategy.rollingUpdate.maxSurge: Invalid value: "99999%": maxSurge must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%`,
	},
	{
		name: "MachineHealthCheck with an empty selector",
		build: func(ns string) client.Object {
			return beta(validMachineHealthCheck(ns, "everything"), func(mhc *v1beta1.MachineHealthCheck) { mhc.Spec.Selector = v1beta1.LabelSelector{} })
		},
		want: `spec.selector: Invalid value: ` + betaEmptySelectorMsg,
	},
	{
		name: "MachineDisruptionBudget with an empty selector",
		build: func(ns string) client.Object {
			return beta(validMachineDisruptionBudget(ns, "everything"), func(mdb *v1beta1.MachineDisruptionBudget) { mdb.Spec.Selector = v1beta1.LabelSelector{} })
		},
		want: `spec.selector: Invalid value: ` + betaEmptySelectorMsg,
	},
	{
		name: "MachineDrainRule for Machines picked by an empty selector",
		build: func(ns string) client.Object {
			return beta(validMachineDrainRule(ns, "everything"), func(r *v1beta1.MachineDrainRule) {
				r.Spec.Machines = []v1beta1.MachineDrainRuleMachineSelector{{Selector: v1beta1.LabelSelector{}}}
			})
		},
		want: `spec.machines[0].selector: Invalid value: ` + betaEmptySelectorMsg,
	},
	{
		name: "Machine with a node label value longer than 63 characters",
		build: func(ns string) client.Object {
			return beta(validMachine(ns, "labelled"), func(m *v1beta1.Machine) {
				m.Spec.NodeLabels = v1beta1.NodeLabels{"team": strings.Repeat("a", 64)}
			})
		},
		want: `spec.nodeLabels: Invalid value: a node label's key is at most 317 characters (a 253-character prefix, '/', and a 63-character name) and its value at most 63`,
	},
	{
		name: "Machine drained with a grace period over a day",
		build: func(ns string) client.Object {
			return beta(validMachine(ns, "graceful"), func(m *v1beta1.Machine) {
				m.Spec.Drain = &v1beta1.DrainSettings{GracePeriodSeconds: ptr.To[int64](86401)}
			})
		},
		want: "spec.drain.gracePeriodSeconds: Invalid value: 86401: drain gracePeriodSeconds must be from 0 to 86400 (a day)",
	},
	{
		name: "MachineDisruptionBudget that allows more than 100,000 Machines",
		build: func(ns string) client.Object {
			return beta(validMachineDisruptionBudget(ns, "lavish"), func(mdb *v1beta1.MachineDisruptionBudget) { mdb.Spec.MaxDisrupted = intstr.FromInt32(100_001) })
		},
		want: "spec.maxDisrupted: Invalid value: 100001: maxDisrupted must be a whole number of Machines (0 to 100000) or a percentage from 0% to 100%",
	},
	{
		name: "MachineHealthCheck whose condition would count at once (timeout 0s)",
		build: func(ns string) client.Object {
			return beta(fullMachineHealthCheck(ns, "atonce"), func(hc *v1beta1.MachineHealthCheck) {
				hc.Spec.UnhealthyNodeConditions[0].Timeout = metav1.Duration{}
			})
		},
		want: `spec.unhealthyNodeConditions[0].timeout: Invalid value: "0s": ` + betaConditionTimeoutMsg,
	},
	{
		name: "MachineClass with a taint written without a key, at v1beta1",
		build: func(ns string) client.Object {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1beta1.GroupVersion.String(),
				"kind":       "MachineClass",
				"metadata":   map[string]any{"namespace": ns, "name": "nokey"},
				"spec": map[string]any{
					"provider":     "inmemory",
					"nodeTemplate": map[string]any{"nodeTaints": []any{map[string]any{"effect": "NoSchedule"}}},
				},
			}}
		},
		want: schemaErr("spec.nodeTemplate.nodeTaints[0].key: Required value"),
	},
}

// The messages of v1beta1's rules that several cases break.
const (
	betaReplicasMsg         = "replicas must be at most 100000: a larger number is more likely a typo than a fleet"
	betaEmptySelectorMsg    = "selector must not be empty: an empty selector would pick every Machine in the namespace; to mean every Machine, say so with a matchExpressions entry they all meet"
	betaConditionTimeoutMsg = "a condition's timeout must be more than 0s: a condition makes a Machine unhealthy only once it has held for a while, such as 60s"
)

// toBeta converts a v1alpha1 object to v1beta1 as the webhook would. A
// case written as raw JSON, to say what Go types cannot, is sent as it is
// at v1beta1.
func toBeta(o client.Object) client.Object {
	if u, ok := o.(*unstructured.Unstructured); ok {
		u = u.DeepCopy()
		u.SetAPIVersion(v1beta1.GroupVersion.String())
		return u
	}
	gvk, err := apiutil.GVKForObject(o, k8s.Scheme())
	Expect(err).NotTo(HaveOccurred())
	hub, err := k8s.Scheme().New(v1beta1.GroupVersion.WithKind(gvk.Kind))
	Expect(err).NotTo(HaveOccurred())
	Expect(o.(conversion.Convertible).ConvertTo(hub.(conversion.Hub))).To(Succeed())
	return hub.(client.Object)
}

var _ = Describe("API validation at v1beta1", func() {
	entries := make([]TableEntry, 0, len(invalidCases))
	for _, c := range invalidCases {
		if _, ok := notAtBeta[c.name]; !ok {
			entries = append(entries, Entry(c.name, c))
		}
	}
	It("names only cases that exist where v1beta1 words a refusal otherwise or has no such field", func() {
		names := map[string]bool{}
		for _, c := range invalidCases {
			names[c.name] = true
		}
		for name := range atBeta {
			Expect(names).To(HaveKey(name), "atBeta names no case")
		}
		for name := range notAtBeta {
			Expect(names).To(HaveKey(name), "notAtBeta names no case")
			Expect(atBeta).NotTo(HaveKey(name))
		}
	})
	DescribeTable("refuses every object v1alpha1 refuses, sent at v1beta1",
		func(ctx SpecContext, c invalidCase) {
			ns := env.NewNamespace(GinkgoTB(), "e2e")
			alpha := c.build(ns)
			var beta client.Object
			var err error
			if c.update == nil {
				beta = toBeta(alpha)
				err = k8s.Create(ctx, beta)
			} else {
				Expect(k8s.Create(ctx, alpha)).To(Succeed(), "the object before the update must be valid")
				c.update(alpha)
				beta = toBeta(alpha)
				err = k8s.Update(ctx, beta)
			}
			want := c.want
			if w, ok := atBeta[c.name]; ok {
				want = w
			}
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			Expect(err.Error()).To(Equal(invalidMessage(beta, want)), "the server said:\n%s", err)
		},
		entries,
	)

	It("takes capacity keys that are resource names of every form", func(ctx SpecContext) {
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		class := toBeta(classWithCapacity(validMachineClass(ns, "resources")))
		Expect(k8s.Create(ctx, class)).To(Succeed())
		got := &v1beta1.MachineClass{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(class), got)).To(Succeed())
		Expect(got.Spec.NodeTemplate.Capacity).To(HaveLen(len(resourceNames)))
	})

	It("takes durations in microseconds as Go writes them (µs), and as people type them (us, μs)", func(ctx SpecContext) {
		// Go's metav1.Duration writes a value under a millisecond as
		// "500µs"; a controller that copies such a duration (a template
		// into its MachineSet) must not have its write refused.
		ns := env.NewNamespace(GinkgoTB(), "e2e")
		for i, d := range []string{"500µs", "500μs", "500us", "1m0.5s", "1h30m"} {
			hc := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1beta1.GroupVersion.String(), "kind": "MachineHealthCheck",
				"metadata": map[string]any{"namespace": ns, "name": fmt.Sprintf("micro-%d", i)},
				"spec": map[string]any{
					"selector":                map[string]any{"matchLabels": map[string]any{"pool": "a"}},
					"unhealthyNodeConditions": []any{map[string]any{"type": "Ready", "status": "False", "timeout": d}},
					"remediation": map[string]any{
						"cooldown": d,
						"ladder":   []any{map[string]any{"action": "Reboot", "timeout": "1m" + d}},
					},
				},
			}}
			Expect(k8s.Create(ctx, hc)).To(Succeed(), "a duration of %s", d)
			budget := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1beta1.GroupVersion.String(), "kind": "MachineDisruptionBudget",
				"metadata": map[string]any{"namespace": ns, "name": fmt.Sprintf("micro-%d", i)},
				"spec": map[string]any{
					"selector":     map[string]any{"matchLabels": map[string]any{"pool": "a"}},
					"maxDisrupted": 1,
					"windows":      []any{map[string]any{"schedule": "@daily", "duration": d}},
				},
			}}
			Expect(k8s.Create(ctx, budget)).To(Succeed(), "a window of %s", d)
		}
	})

	betaEntries := make([]TableEntry, 0, len(betaCases))
	for _, c := range betaCases {
		betaEntries = append(betaEntries, Entry(c.name, c))
	}
	DescribeTable("refuses what only v1beta1 forbids",
		func(ctx SpecContext, c betaCase) {
			ns := env.NewNamespace(GinkgoTB(), "e2e")
			obj := c.build(ns)
			var err error
			if c.update == nil {
				err = k8s.Create(ctx, obj)
			} else {
				Expect(k8s.Create(ctx, obj)).To(Succeed(), "the object before the update must be valid")
				c.update(obj)
				err = k8s.Update(ctx, obj)
			}
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			Expect(err.Error()).To(Equal(invalidMessage(obj, c.want)), "the server said:\n%s", err)
		},
		betaEntries,
	)
})
