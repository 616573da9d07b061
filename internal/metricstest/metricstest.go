// Package metricstest reads the gauges a collector serves, for the tests
// of the packages that serve them.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Gauges registers what register registers on a registry of its own (a
// pedantic one, which also checks each series against its description),
// gathers it once and returns every gauge's value by family and by the
// value of its label named label ("" for a series without that label).
func Gauges(t testing.TB, register func(prometheus.Registerer) error, label string) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := register(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetGauge() == nil {
				continue
			}
			key := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					key = l.GetValue()
				}
			}
			if out[f.GetName()] == nil {
				out[f.GetName()] = map[string]float64{}
			}
			out[f.GetName()][key] = m.GetGauge().GetValue()
		}
	}
	return out
}
