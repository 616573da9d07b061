package providers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Outcomes of a provider call, the outcome label of
// machinist_provider_requests_total.
const (
	OutcomeSuccess     = "success"
	OutcomeError       = "error"
	OutcomeUnavailable = "unavailable"
)

// Pinger is an actuator that can be out of reach (a provider served out of
// process): Ping says whether it answers and is ready. In-process
// actuators are always up.
type Pinger interface {
	Ping(ctx context.Context) error
}

// PingTimeout bounds each provider's Ping at a scrape: a provider that
// does not answer within it counts as down, and a scrape is not held up
// for longer (Prometheus' own scrape timeout is 10 s by default).
const PingTimeout = 2 * time.Second

// Metrics are the provider calls' Prometheus metrics: every call the
// controllers make through a Registry that Meter was given, and whether
// each provider answers.
type Metrics struct {
	// Requests counts calls by provider, method and outcome (success,
	// error, unavailable).
	Requests *prometheus.CounterVec
	// Duration observes how long calls took, by provider and method.
	Duration *prometheus.HistogramVec
	up       *upCollector
}

// NewMetrics returns unregistered metrics for the providers in reg.
func NewMetrics(reg *Registry) *Metrics {
	return &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machinist_provider_requests_total",
			Help: "Calls to providers, by provider, method and outcome (success, error, unavailable: the provider did not answer).",
		}, []string{"provider", "method", "outcome"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "machinist_provider_request_duration_seconds",
			Help:    "How long calls to providers took, by provider and method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"provider", "method"}),
		up: &upCollector{reg: reg, desc: prometheus.NewDesc("machinist_provider_up",
			"1 while the provider answers and says it is ready, 0 otherwise; asked at each scrape (in-process providers are always 1).",
			[]string{"provider"}, nil)},
	}
}

// Register adds every metric to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Requests, m.Duration, m.up} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) observe(provider, method string, start time.Time, err error) {
	outcome := OutcomeSuccess
	switch {
	case IsUnavailable(err):
		outcome = OutcomeUnavailable
	case err != nil:
		outcome = OutcomeError
	}
	m.Requests.WithLabelValues(provider, method, outcome).Inc()
	m.Duration.WithLabelValues(provider, method).Observe(time.Since(start).Seconds())
}

type upCollector struct {
	reg  *Registry
	desc *prometheus.Desc
}

func (c *upCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *upCollector) Collect(ch chan<- prometheus.Metric) {
	c.reg.mu.RLock()
	all := make(map[string]Actuator, len(c.reg.actuators))
	for name, a := range c.reg.actuators {
		all[name] = a
	}
	c.reg.mu.RUnlock()
	// Asked side by side, so that a scrape waits for one timeout however
	// many providers are down.
	type answer struct {
		name string
		up   float64
	}
	answers := make(chan answer, len(all))
	for name, a := range all {
		go func() {
			up := 1.0
			if p, ok := a.(Pinger); ok {
				ctx, cancel := context.WithTimeout(context.Background(), PingTimeout)
				defer cancel()
				if p.Ping(ctx) != nil {
					up = 0
				}
			}
			answers <- answer{name, up}
		}()
	}
	for range all {
		a := <-answers
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, a.up, a.name)
	}
}

// metered is an Actuator whose every call is counted and timed.
type metered struct {
	name    string
	a       Actuator
	metrics *Metrics
}

func (m metered) Create(ctx context.Context, machine *machinistv1.Machine, class *machinistv1.MachineClass, join Join) (id string, err error) {
	defer m.observe("Create", time.Now(), &err)
	return m.a.Create(ctx, machine, class, join)
}

func (m metered) Exists(ctx context.Context, providerID string) (ok bool, err error) {
	defer m.observe("Exists", time.Now(), &err)
	return m.a.Exists(ctx, providerID)
}

func (m metered) Delete(ctx context.Context, providerID string) (err error) {
	defer m.observe("Delete", time.Now(), &err)
	return m.a.Delete(ctx, providerID)
}

func (m metered) FindByUID(ctx context.Context, uid types.UID) (id string, err error) {
	defer m.observe("FindByUID", time.Now(), &err)
	return m.a.FindByUID(ctx, uid)
}

// List is metered like the other calls; it is ErrNoList, uncounted,
// for a provider that cannot list.
func (m metered) List(ctx context.Context) (out []Listed, err error) {
	if _, ok := m.a.(Lister); !ok {
		return nil, ErrNoList
	}
	defer m.observe("List", time.Now(), &err)
	return List(ctx, m.a)
}

func (m metered) Reboot(ctx context.Context, providerID string, op Operation) (err error) {
	defer m.observe("Reboot", time.Now(), &err)
	return m.a.Reboot(ctx, providerID, op)
}

func (m metered) Repair(ctx context.Context, providerID string, op Operation) (err error) {
	defer m.observe("Repair", time.Now(), &err)
	return m.a.Repair(ctx, providerID, op)
}

func (m metered) Update(ctx context.Context, providerID string, op Operation) (err error) {
	defer m.observe("Update", time.Now(), &err)
	return m.a.Update(ctx, providerID, op)
}

// InPlace asks nothing of the provider (it reads what it declared).
func (m metered) InPlace(change Change) bool { return m.a.InPlace(change) }

func (m metered) Describe(ctx context.Context, providerID string) (inst Instance, err error) {
	defer m.observe("Describe", time.Now(), &err)
	return m.a.Describe(ctx, providerID)
}

// observe is deferred with the call's start and a pointer to its error,
// which holds the call's result by the time the deferred call runs.
func (m metered) observe(method string, start time.Time, err *error) {
	m.metrics.observe(m.name, method, start, *err)
}
