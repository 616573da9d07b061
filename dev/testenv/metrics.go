package testenv

import (
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// ControllerCounter reads the counter name of the controller named
// controller from the controller-runtime metrics registry of this process
// (controllers started in it, such as StartWithServedControllers's), or 0
// when it has no such series yet.
func ControllerCounter(name, controller string) (float64, error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total, nil
}
