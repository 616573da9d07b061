package testenv

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// Writes counts the API server's successful write requests (POST, PUT,
// PATCH and DELETE) by resource, with the subresource after a slash.
type Writes map[string]float64

// Counts are the write requests kube-apiserver has served.
type Counts struct {
	// Done are the writes that succeeded (2xx).
	Done Writes
	// Refused are the writes that failed (conflicts, throttling, invalid).
	Refused Writes
	// Lists are the LIST requests served (not watches), whatever their
	// outcome: the reads that pass every cache.
	Lists Writes
}

// ReadWrites scrapes apiserver_request_total from kube-apiserver's /metrics.
func ReadWrites(ctx context.Context, kube kubernetes.Interface) (Counts, error) {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return Counts{}, fmt.Errorf("scraping kube-apiserver /metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		return Counts{}, fmt.Errorf("parsing kube-apiserver /metrics: %w", err)
	}
	c := Counts{Done: Writes{}, Refused: Writes{}, Lists: Writes{}}
	family, ok := families["apiserver_request_total"]
	if !ok {
		return Counts{}, fmt.Errorf("kube-apiserver /metrics has no apiserver_request_total")
	}
	for _, m := range family.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		key := labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		case "LIST":
			c.Lists[key] += m.GetCounter().GetValue()
			continue
		default:
			continue
		}
		if strings.HasPrefix(labels["code"], "2") {
			c.Done[key] += m.GetCounter().GetValue()
		} else {
			c.Refused[key] += m.GetCounter().GetValue()
		}
	}
	return c, nil
}

// Since returns the writes made between before and w.
func (w Writes) Since(before Writes) Writes {
	d := Writes{}
	for k, v := range w {
		if n := v - before[k]; n > 0 {
			d[k] = n
		}
	}
	return d
}

// Sum adds up the writes to the named resources.
func (w Writes) Sum(resources ...string) float64 {
	var n float64
	for _, r := range resources {
		n += w[r]
	}
	return n
}
