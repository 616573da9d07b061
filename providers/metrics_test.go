package providers

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/machinist-dev/machinist/internal/metricstest"
)

// answering is an actuator whose Delete and Ping return what it is told;
// nothing else of it is called.
type answering struct {
	Actuator
	deleteErr, pingErr error
}

func (a answering) Delete(context.Context, string) error { return a.deleteErr }
func (a answering) Ping(context.Context) error           { return a.pingErr }

// TestMeteredCallsAreCountedByOutcome: once metered, every call through
// the registry is counted by provider, method and outcome, and each
// provider's up gauge says whether its Ping answers.
func TestMeteredCallsAreCountedByOutcome(t *testing.T) {
	reg := NewRegistry()
	for name, a := range map[string]Actuator{
		"fine":  answering{},
		"wrong": answering{deleteErr: errors.New("no such instance"), pingErr: errors.New("not ready")},
		"gone":  answering{deleteErr: Unavailable(errors.New("connection refused"))},
	} {
		if err := reg.Register(name, a); err != nil {
			t.Fatal(err)
		}
	}
	m := NewMetrics(reg)
	reg.Meter(m)
	for _, name := range []string{"fine", "fine", "wrong", "gone"} {
		a, err := reg.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		_ = a.Delete(context.Background(), "id")
	}
	for _, c := range []struct {
		provider, outcome string
		want              float64
	}{
		{"fine", OutcomeSuccess, 2}, {"fine", OutcomeError, 0},
		{"wrong", OutcomeError, 1}, {"wrong", OutcomeSuccess, 0},
		{"gone", OutcomeUnavailable, 1}, {"gone", OutcomeError, 0},
	} {
		if got := testutil.ToFloat64(m.Requests.WithLabelValues(c.provider, "Delete", c.outcome)); got != c.want {
			t.Errorf("%s Delete %s: %v calls, want %v", c.provider, c.outcome, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.Duration); n != 3 {
		t.Errorf("durations observed for %d providers, want 3", n)
	}

	up := metricstest.Gauges(t, m.Register, "provider")["machinist_provider_up"]
	if want := map[string]float64{"fine": 1, "wrong": 0, "gone": 1}; len(up) != 3 || up["fine"] != 1 || up["wrong"] != 0 || up["gone"] != 1 {
		t.Errorf("machinist_provider_up = %v, want %v", up, want)
	}
}
