package e2e

import (
	"fmt"
	"maps"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// The valid objects below are the starting point of the validation table:
// each invalid case changes exactly one thing, so a rejection can only come
// from that change.

func validMachineClass(ns, name string) *machinistv1.MachineClass {
	return &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineClassSpec{Provider: "inmemory"},
	}
}

func validMachine(ns, name string) *machinistv1.Machine {
	return &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineSpec{
			ClassRef: machinistv1.ClassReference{Name: "small"},
			Version:  "v1.37.2",
		},
	}
}

func validTemplate(labels map[string]string) machinistv1.MachineTemplateSpec {
	return machinistv1.MachineTemplateSpec{
		Metadata: machinistv1.TemplateMetadata{Labels: labels},
		Spec: machinistv1.MachineSpec{
			ClassRef: machinistv1.ClassReference{Name: "small"},
			Version:  "v1.37.2",
		},
	}
}

func validMachineSet(ns, name string, replicas int32) *machinistv1.MachineSet {
	labels := map[string]string{"pool": name}
	return &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: validTemplate(labels),
		},
	}
}

func validMachineDeployment(ns, name string) *machinistv1.MachineDeployment {
	labels := map[string]string{"pool": name}
	return &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: validTemplate(labels),
			Strategy: machinistv1.MachineDeploymentStrategy{
				Type: machinistv1.RollingUpdateStrategy,
				RollingUpdate: &machinistv1.RollingUpdate{
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				},
			},
		},
	}
}

// validWorkloadCluster reads its kubeconfig from Cluster API's Secret for
// a cluster of that name, under the key "value" left to its default.
func validWorkloadCluster(ns, name string) *machinistv1.WorkloadCluster {
	return &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.WorkloadClusterSpec{
			Kubeconfig: machinistv1.KubeconfigReference{SecretName: name + "-kubeconfig"},
		},
	}
}

// workloadClusterYAML is a WorkloadCluster written as a user's YAML would
// be, with spec exactly as given: the Go type cannot leave out secretName
// or the kubeconfig, and omitempty drops an empty key.
func workloadClusterYAML(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": machinistv1.GroupVersion.String(),
		"kind":       "WorkloadCluster",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       spec,
	}}
}

// machineInCluster is a valid Machine serving the WorkloadCluster named
// cluster ("" for the manager's own cluster).
func machineInCluster(ns, name, cluster string) *machinistv1.Machine {
	m := validMachine(ns, name)
	m.Spec.ClusterName = cluster
	return m
}

// validMachineHealthCheck selects the Machines labelled pool=name and
// leaves everything else to the defaults.
func validMachineHealthCheck(ns, name string) *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
		},
	}
}

// fullMachineHealthCheck sets every field of a MachineHealthCheck's spec,
// none to its default.
func fullMachineHealthCheck(ns, name string) *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: metav1.LabelSelector{
				MatchLabels: map[string]string{"pool": name},
				MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
				},
			},
			NodeStartupTimeout: &metav1.Duration{Duration: 15 * time.Minute},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 2 * time.Minute}},
				{Type: "KernelDeadlock", Status: "True", Timeout: metav1.Duration{Duration: 30 * time.Second}},
			},
			Remediation: machinistv1.Remediation{
				Ladder: []machinistv1.Rung{
					rung(machinistv1.RemediateReboot, "hard", "2m"),
					rung(machinistv1.RemediateRepair, "", "20m"),
					rung(machinistv1.RemediateReplace, "", ""),
				},
				MaxInFlight: ptr.To(intstr.FromString("25%")),
				Cooldown:    &metav1.Duration{Duration: time.Hour},
			},
			MaxUnhealthy: ptr.To(intstr.FromInt32(3)),
		},
	}
}

// healthCheckYAML is a MachineHealthCheck written as a user's YAML would
// be: its selector, and the spec fields given, exactly as given. The Go
// type cannot send a malformed duration, an empty list (omitempty drops
// it) or a spec without remediation (it always sends "remediation": {}).
func healthCheckYAML(ns, name string, spec map[string]any) *unstructured.Unstructured {
	s := map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"pool": name}}}
	maps.Copy(s, spec)
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": machinistv1.GroupVersion.String(),
		"kind":       "MachineHealthCheck",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       s,
	}}
}

// rung is one rung of a remediation ladder; timeout "" leaves it unset.
func rung(action machinistv1.RemediationAction, mode, timeout string) machinistv1.Rung {
	r := machinistv1.Rung{Action: action, Mode: mode}
	if timeout != "" {
		d, err := time.ParseDuration(timeout)
		if err != nil {
			panic(err)
		}
		r.Timeout = &metav1.Duration{Duration: d}
	}
	return r
}

// replicasOf returns spec.replicas of a MachineSet or MachineDeployment.
func replicasOf(o client.Object) *int32 {
	switch o := o.(type) {
	case *machinistv1.MachineSet:
		return o.Spec.Replicas
	case *machinistv1.MachineDeployment:
		return o.Spec.Replicas
	}
	panic(fmt.Sprintf("%T has no replicas", o))
}
