// Command metricnames prints, one per line and sorted, the names of the
// metrics that the PromQL expressions of Prometheus rule files (plain, or
// a PrometheusRule's spec) and Grafana dashboards use, parsed by
// Prometheus' own PromQL parser. Machinist's tests check each name
// against the manager's real /metrics.
//
//	metricnames config/prometheus/prometheusrule.yaml config/grafana/machinist.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// promql is the parser promtool uses, with its default options.
var promql = parser.NewParser(parser.Options{})

func main() {
	names := map[string]bool{}
	for _, file := range os.Args[1:] {
		exprs, err := expressions(file)
		if err != nil {
			fail(err)
		}
		if len(exprs) == 0 {
			fail(fmt.Errorf("%s: no expression found", file))
		}
		for _, e := range exprs {
			parsed, err := promql.ParseExpr(grafanaVariables.Replace(e))
			if err != nil {
				fail(fmt.Errorf("%s: %q: %w", file, e, err))
			}
			parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
				if vs, ok := node.(*parser.VectorSelector); ok {
					if vs.Name != "" {
						names[vs.Name] = true
					}
					for _, m := range vs.LabelMatchers {
						if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
							names[m.Value] = true
						}
					}
				}
				return nil
			})
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	fmt.Println(strings.Join(sorted, "\n"))
}

// grafanaVariables stand for what Grafana puts in their place, so that the
// dashboard's queries parse as Prometheus receives them.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", ".+")

func expressions(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if filepath.Ext(file) == ".json" {
		var d struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		var out []string
		var walk func([]panel)
		walk = func(ps []panel) {
			for _, p := range ps {
				for _, t := range p.Targets {
					out = append(out, t.Expr)
				}
				walk(p.Panels)
			}
		}
		walk(d.Panels)
		return out, nil
	}
	var doc struct {
		Groups []group `yaml:"groups"`
		Spec   struct {
			Groups []group `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []string
	for _, g := range append(doc.Groups, doc.Spec.Groups...) {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out, nil
}

type panel struct {
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type group struct {
	Rules []struct {
		Expr string `yaml:"expr"`
	} `yaml:"rules"`
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "metricnames:", err)
	os.Exit(1)
}
