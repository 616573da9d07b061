// Package monitoring_test checks config/prometheus and config/grafana:
// the alerts with Prometheus' own promtool (check rules, and unit tests
// with synthetic series for every alert, firing and not firing), the
// dashboard's shape, and that every metric the rules and the dashboard use
// is one the manager really serves.
package monitoring_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/machinist-dev/machinist/dev/testenv"
)

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// tools builds promtool and metricnames, pinned in hack/promtool's own
// module (Prometheus' dependencies stay out of Machinist's), once per run.
func tools(t *testing.T) (promtool, metricnames string) {
	t.Helper()
	toolsOnce.Do(func() {
		toolsDir, toolsErr = os.MkdirTemp("", "machinist-promtool-")
		if toolsErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", toolsDir+"/", "github.com/prometheus/prometheus/cmd/promtool", "./metricnames")
		cmd.Dir = filepath.Join(testenv.Root(), "hack", "promtool")
		// Prometheus' service discovery is left out: promtool's rule
		// commands do not use it, and it is most of what it would build.
		cmd.Env = append(os.Environ(), "GOFLAGS=-tags=remove_all_sd")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			toolsErr = &buildError{err: err, out: out.String()}
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return filepath.Join(toolsDir, "promtool"), filepath.Join(toolsDir, "metricnames")
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "building promtool: " + e.err.Error() + "\n" + e.out }

var env *testenv.Env

func TestMain(m *testing.M) {
	code := testenv.Run(m, func(e *testenv.Env) { env = e })
	if toolsDir != "" {
		_ = os.RemoveAll(toolsDir)
	}
	os.Exit(code)
}

// rule is what the tests read of an alerting rule.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type groups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

// rulesFile writes the PrometheusRule's spec, a plain rule file, into dir.
func rulesFile(t *testing.T, dir string) (string, groups) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Spec       json.RawMessage `json:"spec"`
	}
	if err := sigsyaml.Unmarshal(b, &obj); err != nil {
		t.Fatal(err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		t.Fatalf("config/prometheus/prometheusrule.yaml is a %s %s, not a monitoring.coreos.com/v1 PrometheusRule", obj.APIVersion, obj.Kind)
	}
	var g groups
	if err := json.Unmarshal(obj.Spec, &g); err != nil {
		t.Fatal(err)
	}
	spec, err := sigsyaml.JSONToYAML(obj.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(path, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, g
}

func run(t *testing.T, dir, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules runs promtool check rules and promtool test rules, and
// checks that each alert is tested both firing and not firing, and has
// a summary, a severity and a runbook in docs/operations.md.
func TestAlertRules(t *testing.T) {
	promtool, _ := tools(t)
	dir := t.TempDir()
	rules, g := rulesFile(t, dir)
	t.Log(run(t, dir, promtool, "check", "rules", rules))

	tests, err := filepath.Glob(filepath.Join(testenv.Root(), "config", "prometheus", "tests", "*.yaml"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no promtool tests in config/prometheus/tests: %v", err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	var args []string
	for _, src := range tests {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, filepath.Base(src))
		var file struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string            `json:"alertname"`
					ExpAlerts []json.RawMessage `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		if err := sigsyaml.Unmarshal(b, &file); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		for _, tc := range file.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	t.Log(run(t, dir, promtool, append([]string{"test", "rules"}, args...)...))

	runbooks, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !firing[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: tested firing %v, not firing %v; want both", r.Alert, firing[r.Alert], quiet[r.Alert])
			}
			if r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("alert %s has no summary or no severity", r.Alert)
			}
			anchor := strings.ToLower(r.Alert)
			if r.Annotations["runbook_url"] != "https://github.com/machinist-dev/machinist/blob/main/docs/operations.md#"+anchor {
				t.Errorf("alert %s: runbook_url %q is not docs/operations.md#%s", r.Alert, r.Annotations["runbook_url"], anchor)
			}
			if !regexp.MustCompile(`(?m)^#+ ` + regexp.QuoteMeta(r.Alert) + `$`).Match(runbooks) {
				t.Errorf("alert %s has no runbook section (a heading %q) in docs/operations.md", r.Alert, r.Alert)
			}
		}
	}
	for _, want := range []string{
		"MachinistMachineOverdue", "MachinistProviderUnavailable", "MachinistHealthCheckShortCircuited",
		"MachinistDisruptionBudgetExhausted", "MachinistWorkloadClusterUnreachable", "MachinistNoLeader",
	} {
		if !firing[want] {
			t.Errorf("no alert %s, tested firing", want)
		}
	}
	t.Logf("%d alerts, each tested firing and not firing", alerts)
}

// TestDashboard checks the dashboard is one Grafana imports: panels with
// unique ids and a place on the grid, every query on the data source
// variable, and a description on every panel.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "grafana", "machinist.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID          int    `json:"id"`
			Type        string `json:"type"`
			Title       string `json:"title"`
			Description string `json:"description"`
			GridPos     *struct {
				H, W, X, Y int
			} `json:"gridPos"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("config/grafana/machinist.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard has no uid or no title")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Error("no data source variable: the dashboard would be bound to one Grafana's data source")
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q has no place on the grid", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Description == "" {
			t.Errorf("panel %q has no description", p.Title)
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the data source variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			if q.Expr == "" || q.RefID == "" {
				t.Errorf("panel %q has a query without expr or refId", p.Title)
			}
		}
	}
	for _, want := range []string{"Machines by phase", "Transitions per second", "Operation outcomes", "Remediation outcomes",
		"Rollout progress", "Provider call latency (p99)", "Writes per second"} {
		found := false
		for _, p := range d.Panels {
			found = found || p.Title == want
		}
		if !found {
			t.Errorf("no panel %q", want)
		}
	}
	t.Logf("%d panels, %d queries", len(d.Panels), queries)
}
