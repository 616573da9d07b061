package template

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/nodes"
)

func class() *machinistv1.MachineClass {
	return &machinistv1.MachineClass{Spec: machinistv1.MachineClassSpec{NodeTemplate: &machinistv1.NodeTemplate{
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"), corev1.ResourcePods: resource.MustParse("50"),
			"example.com/gpu": resource.MustParse("2"),
		},
		NodeLabels: machinistv1.NodeLabels{"tier": "class", "zone": "a"},
		NodeTaints: machinistv1.NodeTaints{{Key: "dedicated", Value: "class", Effect: corev1.TaintEffectNoSchedule}},
	}}}
}

func TestTheMachinesOwnLabelsAndTaintsWinOverTheClasss(t *testing.T) {
	spec := &machinistv1.MachineSpec{
		NodeLabels: machinistv1.NodeLabels{"tier": "machine"},
		NodeTaints: machinistv1.NodeTaints{
			{Key: "dedicated", Value: "machine", Effect: corev1.TaintEffectNoSchedule},
			{Key: "gpu", Effect: corev1.TaintEffectNoExecute},
		},
	}
	n := nodes.TemplateFor(class(), spec)
	if want := map[string]string{"tier": "machine", "zone": "a"}; !maps.Equal(n.Labels, want) {
		t.Errorf("labels %v, want %v", n.Labels, want)
	}
	want := []corev1.Taint{{Key: "dedicated", Value: "machine", Effect: corev1.TaintEffectNoSchedule}, {Key: "gpu", Effect: corev1.TaintEffectNoExecute}}
	if !slices.Equal(n.Taints, want) {
		t.Errorf("taints %v, want %v", n.Taints, want)
	}
	if q := n.Capacity[corev1.ResourceCPU]; q.String() != "4" {
		t.Errorf("cpu %s, want the class's 4", q.String())
	}
	if n := nodes.TemplateFor(nil, &machinistv1.MachineSpec{}); len(n.Labels) != 0 || n.Taints != nil || n.Capacity != nil {
		t.Errorf("a missing class and an empty spec give %+v, want nothing", n)
	}
}

func TestAnnotationsSayTheCapacityLabelsAndTaintsAsTheAutoscalerParsesThem(t *testing.T) {
	got := Annotations(nodes.TemplateFor(class(), &machinistv1.MachineSpec{NodeTaints: machinistv1.NodeTaints{{Key: "b", Effect: corev1.TaintEffectNoExecute}}}))
	want := map[string]string{
		CPUAnnotation:           "4",
		MemoryAnnotation:        "8Gi",
		EphemeralDiskAnnotation: "100Gi",
		MaxPodsAnnotation:       "50",
		GPUTypeAnnotation:       "example.com/gpu",
		GPUCountAnnotation:      "2",
		LabelsAnnotation:        "tier=class,zone=a",
		TaintsAnnotation:        "b:NoExecute,dedicated=class:NoSchedule",
	}
	if !maps.Equal(got, want) {
		t.Errorf("annotations\n%v\nwant\n%v", got, want)
	}
	if got := Annotations(nodes.Template{}); len(got) != 0 {
		t.Errorf("a Node that says nothing publishes %v", got)
	}
}

func TestPublishKeepsAPersonsValue(t *testing.T) {
	rec := func(m map[string]string) string { b, _ := json.Marshal(m); return string(b) }
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        map[string]string
		set         map[string]string
		remove      []string
		record      string
	}{{
		name:   "nothing published yet",
		want:   map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi"},
		set:    map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi"},
		record: rec(map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi"}),
	}, {
		name:        "current",
		annotations: map[string]string{CPUAnnotation: "4", PublishedAnnotation: rec(map[string]string{CPUAnnotation: "4"})},
		want:        map[string]string{CPUAnnotation: "4"},
		set:         map[string]string{},
		record:      rec(map[string]string{CPUAnnotation: "4"}),
	}, {
		name:        "the class changed",
		annotations: map[string]string{CPUAnnotation: "4", PublishedAnnotation: rec(map[string]string{CPUAnnotation: "4"})},
		want:        map[string]string{CPUAnnotation: "8"},
		set:         map[string]string{CPUAnnotation: "8"},
		record:      rec(map[string]string{CPUAnnotation: "8"}),
	}, {
		name:        "a person's value before any was published",
		annotations: map[string]string{CPUAnnotation: "16"},
		want:        map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi"},
		set:         map[string]string{MemoryAnnotation: "8Gi"},
		record:      rec(map[string]string{MemoryAnnotation: "8Gi"}),
	}, {
		name:        "a person changed a published value",
		annotations: map[string]string{CPUAnnotation: "16", PublishedAnnotation: rec(map[string]string{CPUAnnotation: "4"})},
		want:        map[string]string{CPUAnnotation: "8"},
		set:         map[string]string{},
	}, {
		name:        "the class no longer says it",
		annotations: map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi", PublishedAnnotation: rec(map[string]string{CPUAnnotation: "4", MemoryAnnotation: "8Gi"})},
		want:        map[string]string{CPUAnnotation: "4"},
		set:         map[string]string{},
		remove:      []string{MemoryAnnotation},
		record:      rec(map[string]string{CPUAnnotation: "4"}),
	}, {
		name:        "the class no longer says what a person changed",
		annotations: map[string]string{MemoryAnnotation: "16Gi", PublishedAnnotation: rec(map[string]string{MemoryAnnotation: "8Gi"})},
		set:         map[string]string{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			set, remove, record := Publish(tc.annotations, tc.want)
			if !maps.Equal(set, tc.set) || !slices.Equal(remove, tc.remove) || record != tc.record {
				t.Errorf("Publish = %v, %v, %q; want %v, %v, %q", set, remove, record, tc.set, tc.remove, tc.record)
			}
		})
	}
}
