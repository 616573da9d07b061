package machine

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

// Metrics are the lifecycle's Prometheus metrics.
type Metrics struct {
	// Transitions counts every transition by from, to and event.
	Transitions *prometheus.CounterVec
	// TimeInPhase observes how long a Machine stood in a phase when it left.
	TimeInPhase *prometheus.HistogramVec
	byPhase     *phaseCollector
}

// NewMetrics returns the lifecycle metrics. machines is read at every
// scrape to count Machines by phase, so the gauge is always true of the
// cluster, also after a restart; pass the manager's cached reader.
func NewMetrics(machines client.Reader) *Metrics {
	m := &Metrics{
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machinist_machine_transitions_total",
			Help: "Machine state machine transitions, by from phase, to phase and event.",
		}, []string{"from", "to", "event"}),
		TimeInPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "machinist_machine_phase_duration_seconds",
			Help:    "How long Machines stood in a phase before leaving it.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2.5, 14),
		}, []string{"phase"}),
		byPhase: &phaseCollector{
			machines: machines,
			desc: prometheus.NewDesc("machinist_machines",
				"Machines by phase (an empty phase counts as Pending).", []string{"phase"}, nil),
			overdue: prometheus.NewDesc("machinist_machines_overdue",
				"Machines still in a phase past the timeout that bounds it (Provisioning, Draining for an operation, Rebooting, Repairing, Updating): the controller should have failed or ended them.",
				[]string{"phase"}, nil),
		},
	}
	// Every move of the table is served from the start, at zero: an
	// alert or a chart on a kind of move sees its first one as an
	// increase, not as a new series.
	for _, r := range phases.Table.Rules {
		for _, from := range r.From {
			m.Transitions.WithLabelValues(string(from), string(r.To), string(r.Event))
		}
	}
	return m
}

// Register adds every metric to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Transitions, m.TimeInPhase, m.byPhase} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ByPhase is the collector of the machines-by-phase gauge.
func (m *Metrics) ByPhase() prometheus.Collector { return m.byPhase }

func (m *Metrics) observe(t machinistv1.Transition, enteredFrom time.Time) {
	m.Transitions.WithLabelValues(string(t.From), string(t.To), t.Event).Inc()
	if !enteredFrom.IsZero() {
		m.TimeInPhase.WithLabelValues(string(t.From)).Observe(t.Time.Sub(enteredFrom).Seconds())
	}
}

type phaseCollector struct {
	machines client.Reader
	desc     *prometheus.Desc
	overdue  *prometheus.Desc
	// deadline is when the Machine's phase times out (zero: never); the
	// Machine controller sets it, so that the gauge and the controller
	// judge by the same timeouts.
	deadline func(m *machinistv1.Machine) time.Time
}

func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.overdue
}

func (c *phaseCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Counted, never modified: no deep copy of every Machine per scrape.
	var list machinistv1.MachineList
	if err := c.machines.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	counts := map[machinistv1.MachinePhase]int{}
	overdue := map[machinistv1.MachinePhase]int{}
	for _, p := range phases.States() {
		if p != phases.Gone {
			counts[p] = 0
			overdue[p] = 0
		}
	}
	now := time.Now()
	for i := range list.Items {
		m := &list.Items[i]
		p := m.Status.Phase
		if p == "" {
			p = phases.Initial
		}
		counts[p]++
		if c.deadline != nil {
			if d := c.deadline(m); !d.IsZero() && now.After(d) {
				overdue[p]++
			}
		}
	}
	for p, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(p))
		ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, float64(overdue[p]), string(p))
	}
}

// deadline is when m's phase times out, by the timeouts the controller
// enforces: zero for a phase no timeout bounds, and for a Machine being
// deleted, whose deletion waits as long as it must.
func (r *Reconciler) deadline(m *machinistv1.Machine) time.Time {
	if !m.DeletionTimestamp.IsZero() {
		return time.Time{}
	}
	entered := m.CreationTimestamp.Time
	if t := m.Status.LastTransition; t != nil {
		entered = t.Time.Time
	}
	switch m.Status.Phase {
	case machinistv1.MachineProvisioning:
		return entered.Add(r.provisionTimeout())
	case machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineUpdating:
		return entered.Add(r.operationTimeout())
	case machinistv1.MachineDraining:
		return operation.Deadline(m.Status.Operation)
	}
	return time.Time{}
}
