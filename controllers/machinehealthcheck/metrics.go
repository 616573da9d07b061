package machinehealthcheck

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Metrics are the health checks' Prometheus metrics.
type Metrics struct {
	// Rungs counts rungs by action and outcome: started, succeeded,
	// failed, skipped.
	Rungs *prometheus.CounterVec
	// Recovery is the time from a Machine found unhealthy to a rung
	// bringing it back.
	Recovery prometheus.Histogram
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		Rungs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machinist_remediations_total",
			Help: "Rungs of MachineHealthCheck remediation ladders, by action (Reboot, Repair, Replace) and outcome (started, succeeded, failed, skipped).",
		}, []string{"action", "outcome"}),
		Recovery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "machinist_remediation_recovery_seconds",
			Help:    "Time from a Machine found unhealthy to a remediation bringing it back healthy.",
			Buckets: prometheus.ExponentialBuckets(5, 2, 12),
		}),
	}
	// Every rung and outcome is served from the start, at zero (see
	// lifecycle.NewMetrics).
	for _, a := range []machinistv1.RemediationAction{machinistv1.RemediateReboot, machinistv1.RemediateRepair, machinistv1.RemediateReplace} {
		for _, o := range []string{outcomeStarted, outcomeSucceeded, outcomeFailed, outcomeSkipped} {
			m.Rungs.WithLabelValues(string(a), o)
		}
	}
	return m
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if err := reg.Register(m.Rungs); err != nil {
		return err
	}
	return reg.Register(m.Recovery)
}

func (m *Metrics) record(counts []count, healed time.Duration) {
	for _, c := range counts {
		m.Rungs.WithLabelValues(string(c.action), c.outcome).Inc()
	}
	if healed > 0 {
		m.Recovery.Observe(healed.Seconds())
	}
}
