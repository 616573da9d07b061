package machine

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestSpecDiff(t *testing.T) {
	base := machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.1",
		NodeLabels: map[string]string{"zone": "a"}}
	for _, tc := range []struct {
		name   string
		change func(*machinistv1.MachineSpec)
		want   string
	}{
		{"the same", func(*machinistv1.MachineSpec) {}, ""},
		{"its own providerID does not count", func(s *machinistv1.MachineSpec) { s.ProviderID = "process:///x" }, ""},
		{"version", func(s *machinistv1.MachineSpec) { s.Version = "v1.37.2" }, "version v1.37.1, template v1.37.2"},
		{"class", func(s *machinistv1.MachineSpec) { s.ClassRef.Name = "large" }, "class small, template large"},
		{"cluster", func(s *machinistv1.MachineSpec) { s.ClusterName = "blue" }, "cluster (none), template blue"},
		{"version unset", func(s *machinistv1.MachineSpec) { s.Version = "" }, "version v1.37.1, template (none)"},
		{"labels and taints", func(s *machinistv1.MachineSpec) {
			s.NodeLabels = nil
			s.NodeTaints = machinistv1.NodeTaints{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
		}, "nodeLabels; nodeTaints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := *base.DeepCopy()
			tc.change(&tmpl)
			if got := specDiff(base, tmpl); got != tc.want {
				t.Errorf("specDiff = %q, want %q", got, tc.want)
			}
		})
	}
}
