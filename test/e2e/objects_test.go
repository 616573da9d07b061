package e2e

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
