package lifecycle

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/phases"
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
	return &Metrics{
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
		},
	}
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
}

func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

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
	for _, p := range phases.States() {
		if p != phases.Gone {
			counts[p] = 0
		}
	}
	for i := range list.Items {
		p := list.Items[i].Status.Phase
		if p == "" {
			p = phases.Initial
		}
		counts[p]++
	}
	for p, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(p))
	}
}
