package e2e

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// invalidCase is one object the API server must refuse. When update is nil,
// build's object is refused on create; otherwise it is created (it is
// valid), update changes it, and the update is refused.
type invalidCase struct {
	name   string
	build  func(ns string) client.Object
	update func(client.Object)
	want   string
}

var invalidCases = []invalidCase{
	{
		name: "MachineSet with negative replicas",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "neg", 1)
			ms.Spec.Replicas = ptr.To(int32(-1))
			return ms
		},
		want: "spec.replicas: Invalid value: -1: replicas must be zero or more",
	},
	{
		name: "MachineSet whose selector misses the template's labels",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "mismatch", 1)
			ms.Spec.Template.Metadata.Labels = map[string]string{"pool": "other"}
			return ms
		},
		want: "selector does not match the template's labels",
	},
	{
		name: "MachineDeployment whose matchExpressions miss the template's labels",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "exprs")
			md.Spec.Selector = machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{
				{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
			}}
			return md
		},
		want: "selector's matchExpressions do not match the template's labels",
	},
	{
		name: "MachineSet with an empty selector",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "empty", 1)
			ms.Spec.Selector = machinistv1.LabelSelector{}
			return ms
		},
		want: "selector must not be empty",
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
		want: "selector is immutable: create a new MachineSet",
	},
	{
		name: "MachineSet with an unknown delete policy",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "policy", 1)
			ms.Spec.DeletePolicy = "Biggest"
			return ms
		},
		want: `spec.deletePolicy: Unsupported value: "Biggest": supported values: "Random", "Newest", "Oldest"`,
	},
	{
		name: "MachineSet template that names a providerID",
		build: func(ns string) client.Object {
			ms := validMachineSet(ns, "pinned", 1)
			ms.Spec.Template.Spec.ProviderID = "inmemory:///a"
			return ms
		},
		want: "a template cannot set providerID",
	},
	{
		name: "MachineDeployment with maxSurge and maxUnavailable both zero",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "stuck")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("0%"))
			return md
		},
		want: "maxSurge and maxUnavailable cannot both be zero",
	},
	{
		name: "MachineDeployment with a malformed maxSurge",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "surge")
			md.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("ten"))
			return md
		},
		want: "maxSurge must be a whole number of Machines (0 or more) or a percentage such as 25%",
	},
	{
		name: "MachineDeployment with maxUnavailable over 100%",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "unavail")
			md.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("150%"))
			return md
		},
		want: "maxUnavailable must be a whole number of Machines (0 or more) or a percentage from 0% to 100%",
	},
	{
		name: "MachineDeployment with an unknown strategy type",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "bluegreen")
			md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: "BlueGreen"}
			return md
		},
		want: `spec.strategy.type: Unsupported value: "BlueGreen": supported values: "RollingUpdate", "Recreate", "OnDelete"`,
	},
	{
		name: "MachineDeployment with rollingUpdate under the Recreate strategy",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "recreate")
			md.Spec.Strategy.Type = machinistv1.RecreateStrategy
			return md
		},
		want: "rollingUpdate may only be set when the strategy type is RollingUpdate",
	},
	{
		name: "MachineDeployment whose progress deadline is not after minReadySeconds",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "deadline")
			md.Spec.MinReadySeconds = 60
			md.Spec.ProgressDeadlineSeconds = ptr.To(int32(60))
			return md
		},
		want: "progressDeadlineSeconds must be greater than minReadySeconds",
	},
	{
		name: "MachineDeployment with negative revisionHistoryLimit",
		build: func(ns string) client.Object {
			md := validMachineDeployment(ns, "history")
			md.Spec.RevisionHistoryLimit = ptr.To(int32(-1))
			return md
		},
		want: "revisionHistoryLimit must be zero or more",
	},
	{
		name: "Machine without a class name",
		build: func(ns string) client.Object {
			m := validMachine(ns, "classless")
			m.Spec.ClassRef.Name = ""
			return m
		},
		want: "classRef.name is required: name the MachineClass this Machine is built from",
	},
	{
		name: "Machine whose providerID changes",
		build: func(ns string) client.Object {
			m := validMachine(ns, "adopted")
			m.Spec.ProviderID = "inmemory:///one"
			return m
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ProviderID = "inmemory:///two" },
		want:   "providerID is immutable once set",
	},
	{
		name: "Machine whose providerID is removed",
		build: func(ns string) client.Object {
			m := validMachine(ns, "unadopted")
			m.Spec.ProviderID = "inmemory:///one"
			return m
		},
		update: func(o client.Object) { o.(*machinistv1.Machine).Spec.ProviderID = "" },
		want:   "providerID cannot be removed once set",
	},
	{
		name: "Machine with a taint of unknown effect",
		build: func(ns string) client.Object {
			m := validMachine(ns, "tainted")
			m.Spec.NodeTaints = machinistv1.NodeTaints{{Key: "dedicated", Effect: "NoEntry"}}
			return m
		},
		want: "taint effect must be one of NoSchedule, PreferNoSchedule or NoExecute",
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
		want: "drain timeout must be a duration such as 90s, 5m or 1h30m",
	},
	{
		name: "MachineClass with a taint that has no key",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "keyless")
			mc.Spec.NodeTemplate = &machinistv1.NodeTemplate{Taints: machinistv1.NodeTaints{{Effect: corev1.TaintEffectNoSchedule}}}
			return mc
		},
		want: "every taint needs a key",
	},
	{
		name: "MachineClass without a provider",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "noprovider")
			mc.Spec.Provider = ""
			return mc
		},
		want: "provider is required: name the actuator that builds these Machines",
	},
	{
		name: "MachineClass with a negative drain grace period",
		build: func(ns string) client.Object {
			mc := validMachineClass(ns, "grace")
			mc.Spec.Drain = &machinistv1.DrainSettings{GracePeriodSeconds: ptr.To(int64(-5))}
			return mc
		},
		want: "drain gracePeriodSeconds must be zero or more",
	},
}

var _ = Describe("API validation", func() {
	It("accepts the valid objects every invalid case starts from", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		for _, o := range []client.Object{
			validMachineClass(ns, "small"),
			validMachine(ns, "m"),
			validMachineSet(ns, "ms", 2),
			validMachineDeployment(ns, "md"),
		} {
			Expect(k8s.Create(ctx, o)).To(Succeed(), "%T %s", o, o.GetName())
		}
	})

	It("gives every invalid case its own message", func() {
		seen := map[string]string{}
		for _, c := range invalidCases {
			Expect(c.want).NotTo(BeEmpty(), c.name)
			Expect(seen).NotTo(HaveKey(c.want), "%q and %q expect the same message", c.name, seen[c.want])
			seen[c.want] = c.name
		}
		Expect(len(seen)).To(BeNumerically(">=", 12))
	})

	entries := make([]TableEntry, 0, len(invalidCases))
	for _, c := range invalidCases {
		entries = append(entries, Entry(c.name, c))
	}
	DescribeTable("rejects an invalid object with a message a person understands",
		func(ctx SpecContext, c invalidCase) {
			ns := newNamespace(ctx)
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
			Expect(err.Error()).To(ContainSubstring(c.want))
			if c.update == nil {
				// Nothing of a refused object is stored.
				Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj))).To(BeTrue())
			}
		},
		entries,
	)
})
