// Package gauges reports, at each scrape, the state of the objects that
// operators alert on and chart: health checks held back by maxUnhealthy,
// disruption budgets, workload clusters' reachability and rollouts'
// progress. Each value is read from the manager's cache when Prometheus
// asks, so it is true of the cluster also right after a restart, and costs
// nothing between scrapes.
package gauges

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Fleet is the collector of every gauge of this package.
type Fleet struct {
	reader client.Reader

	shortCircuited *prometheus.Desc
	allowed        *prometheus.Desc
	windowOpen     *prometheus.Desc
	reachable      *prometheus.Desc
	replicas       *prometheus.Desc
}

// New returns the collector; reader is the manager's cached client.
func New(reader client.Reader) *Fleet {
	object := []string{"namespace", "name"}
	return &Fleet{
		reader: reader,
		shortCircuited: prometheus.NewDesc("machinist_healthcheck_short_circuited",
			"1 while a MachineHealthCheck starts no remediation because more Machines are unhealthy than its maxUnhealthy allows, else 0.",
			object, nil),
		allowed: prometheus.NewDesc("machinist_disruption_budget_disruptions_allowed",
			"How many more Machines a MachineDisruptionBudget lets be disrupted now.",
			object, nil),
		windowOpen: prometheus.NewDesc("machinist_disruption_budget_window_open",
			"1 while one of a MachineDisruptionBudget's windows is open (always, without windows), else 0.",
			object, nil),
		reachable: prometheus.NewDesc("machinist_workload_cluster_reachable",
			"1 while the manager reads a WorkloadCluster's API, 0 while it cannot; no series for a cluster that no Machine serves yet.",
			object, nil),
		replicas: prometheus.NewDesc("machinist_machinedeployment_replicas",
			"A MachineDeployment's Machines: desired (spec), current, updated (of the latest template), ready and available.",
			append(object, "state"), nil),
	}
}

// Describe sends every gauge's description.
func (f *Fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{f.shortCircuited, f.allowed, f.windowOpen, f.reachable, f.replicas} {
		ch <- d
	}
}

// Collect reads the cache and sends every gauge.
func (f *Fleet) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f.healthChecks(ctx, ch)
	f.budgets(ctx, ch)
	f.clusters(ctx, ch)
	f.deployments(ctx, ch)
}

// Read, never modified: no deep copy per scrape.
var noCopy = client.UnsafeDisableDeepCopy

func (f *Fleet) healthChecks(ctx context.Context, ch chan<- prometheus.Metric) {
	var list machinistv1.MachineHealthCheckList
	if err := f.reader.List(ctx, &list, noCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(f.shortCircuited, err)
		return
	}
	for i := range list.Items {
		hc := &list.Items[i]
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionRemediationAllowed)
		held := c != nil && c.Status == metav1.ConditionFalse && c.Reason == machinistv1.ReasonTooManyUnhealthy
		ch <- prometheus.MustNewConstMetric(f.shortCircuited, prometheus.GaugeValue, one(held), hc.Namespace, hc.Name)
	}
}

func (f *Fleet) budgets(ctx context.Context, ch chan<- prometheus.Metric) {
	var list machinistv1.MachineDisruptionBudgetList
	if err := f.reader.List(ctx, &list, noCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(f.allowed, err)
		return
	}
	for i := range list.Items {
		b := &list.Items[i]
		ch <- prometheus.MustNewConstMetric(f.allowed, prometheus.GaugeValue, float64(b.Status.DisruptionsAllowed), b.Namespace, b.Name)
		ch <- prometheus.MustNewConstMetric(f.windowOpen, prometheus.GaugeValue, one(b.Status.WindowOpen), b.Namespace, b.Name)
	}
}

func (f *Fleet) clusters(ctx context.Context, ch chan<- prometheus.Metric) {
	var list machinistv1.WorkloadClusterList
	if err := f.reader.List(ctx, &list, noCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(f.reachable, err)
		return
	}
	for i := range list.Items {
		wc := &list.Items[i]
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		if c == nil || c.Reason == machinistv1.ReasonNoMachines {
			continue // nothing to reach it for yet
		}
		ch <- prometheus.MustNewConstMetric(f.reachable, prometheus.GaugeValue, one(c.Status == metav1.ConditionTrue), wc.Namespace, wc.Name)
	}
}

func (f *Fleet) deployments(ctx context.Context, ch chan<- prometheus.Metric) {
	var list machinistv1.MachineDeploymentList
	if err := f.reader.List(ctx, &list, noCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(f.replicas, err)
		return
	}
	for i := range list.Items {
		md := &list.Items[i]
		desired := int32(1)
		if md.Spec.Replicas != nil {
			desired = *md.Spec.Replicas
		}
		for _, s := range []struct {
			state string
			n     int32
		}{
			{"desired", desired},
			{"current", md.Status.Replicas},
			{"updated", md.Status.UpdatedReplicas},
			{"ready", md.Status.ReadyReplicas},
			{"available", md.Status.AvailableReplicas},
		} {
			ch <- prometheus.MustNewConstMetric(f.replicas, prometheus.GaugeValue, float64(s.n), md.Namespace, md.Name, s.state)
		}
	}
}

func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
