package gauges

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/metricstest"
)

// stored serves fixed lists, as the cache would: the collector's only
// reads.
type stored struct {
	healthChecks []machinistv1.MachineHealthCheck
	budgets      []machinistv1.MachineDisruptionBudget
	clusters     []machinistv1.WorkloadCluster
}

func (s stored) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}

func (s stored) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	switch l := list.(type) {
	case *machinistv1.MachineHealthCheckList:
		l.Items = s.healthChecks
	case *machinistv1.MachineDisruptionBudgetList:
		l.Items = s.budgets
	case *machinistv1.WorkloadClusterList:
		l.Items = s.clusters
	}
	return nil
}

func condition(typ string, status metav1.ConditionStatus, reason string) []metav1.Condition {
	return []metav1.Condition{{Type: typ, Status: status, Reason: reason}}
}

// TestTheGaugesSayWhatIsWrong: the values the alerts fire on, read from
// the objects' stored status: a short-circuited health check, a spent
// budget in a closed window, an unreachable cluster; and no series for a
// cluster no Machine serves yet.
func TestTheGaugesSayWhatIsWrong(t *testing.T) {
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: "ns", Name: name} }
	s := stored{
		healthChecks: []machinistv1.MachineHealthCheck{
			{ObjectMeta: meta("held"), Status: machinistv1.MachineHealthCheckStatus{Conditions: condition(machinistv1.ConditionRemediationAllowed, metav1.ConditionFalse, machinistv1.ReasonTooManyUnhealthy)}},
			{ObjectMeta: meta("fine"), Status: machinistv1.MachineHealthCheckStatus{Conditions: condition(machinistv1.ConditionRemediationAllowed, metav1.ConditionTrue, "RemediationAllowed")}},
		},
		budgets: []machinistv1.MachineDisruptionBudget{
			{ObjectMeta: meta("spent"), Status: machinistv1.MachineDisruptionBudgetStatus{DisruptionsAllowed: 0, WindowOpen: false}},
		},
		clusters: []machinistv1.WorkloadCluster{
			{ObjectMeta: meta("down"), Status: machinistv1.WorkloadClusterStatus{Conditions: condition(machinistv1.WorkloadClusterReachable, metav1.ConditionFalse, "Unreachable")}},
			{ObjectMeta: meta("unused"), Status: machinistv1.WorkloadClusterStatus{Conditions: condition(machinistv1.WorkloadClusterReachable, metav1.ConditionUnknown, machinistv1.ReasonNoMachines)}},
		},
	}
	got := metricstest.Gauges(t, func(r prometheus.Registerer) error { return r.Register(New(s)) }, "name")
	for _, w := range []struct {
		family, name string
		want         float64
	}{
		{"machinist_healthcheck_short_circuited", "held", 1},
		{"machinist_healthcheck_short_circuited", "fine", 0},
		{"machinist_disruption_budget_disruptions_allowed", "spent", 0},
		{"machinist_disruption_budget_window_open", "spent", 0},
		{"machinist_workload_cluster_reachable", "down", 0},
	} {
		if x, ok := got[w.family][w.name]; !ok || x != w.want {
			t.Errorf("%s{name=%q} = %v (served %v), want %v", w.family, w.name, x, ok, w.want)
		}
	}
	if _, ok := got["machinist_workload_cluster_reachable"]["unused"]; ok {
		t.Error("a series for a cluster that no Machine serves")
	}
}
