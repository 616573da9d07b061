package monitoring_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestEveryMetricUsedIsServed runs `machinist manager` with leader
// election and secure metrics, as config/manager runs it, over a fleet
// with one of each object the gauges report on (a Machine in a workload
// cluster among them), reads its real /metrics as the ServiceMonitor does
// (HTTPS, the token of a ServiceAccount bound to machinist-metrics-reader),
// and checks that every metric the alerts and the dashboard use is there.
func TestEveryMetricUsedIsServed(t *testing.T) {
	_, metricnames := tools(t)
	out, err := exec.Command(metricnames,
		filepath.Join(testenv.Root(), "config", "prometheus", "prometheusrule.yaml"),
		filepath.Join(testenv.Root(), "config", "grafana", "machinist.json")).CombinedOutput()
	if err != nil {
		t.Fatalf("metricnames: %v\n%s", err, out)
	}
	used := strings.Fields(string(out))
	if len(used) < 10 {
		t.Fatalf("the rules and the dashboard use only %q", used)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	workload, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = workload.Stop() }()

	ns := env.NewNamespace(t, "metrics", testenv.Small)
	port := testenv.FreePort(t)
	binary, err := testenv.Machinist()
	if err != nil {
		t.Fatal(err)
	}
	manager := exec.Command(binary, "manager", "--kubeconfig", env.Kubeconfig,
		"--leader-elect", "--leader-election-namespace", ns,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port), "--metrics-secure", "--health-probe-bind-address=0",
		"--machine-workers=2", "--set-workers=1")
	logs := &testenv.LockedBuffer{}
	manager.Stdout, manager.Stderr = logs, logs
	if err := manager.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = manager.Process.Signal(os.Interrupt)
		_ = manager.Wait()
		if t.Failed() {
			t.Logf("manager:\n%s", logs.String())
		}
	}()

	kubeconfig, err := os.ReadFile(workload.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"pool": "metrics"}
	machine := func(name, cluster string) *machinistv1.Machine {
		return &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, ClusterName: cluster},
		}
	}
	objects := []client.Object{
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edge-kubeconfig"},
			Data:       map[string][]byte{machinistv1.DefaultKubeconfigKey: kubeconfig},
		},
		&machinistv1.WorkloadCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edge"},
			Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: "edge-kubeconfig"}},
		},
		machine("here", ""),
		machine("there", "edge"),
		&machinistv1.MachineHealthCheck{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "metrics"},
			Spec: machinistv1.MachineHealthCheckSpec{
				Selector: machinistv1.LabelSelector{MatchLabels: labels},
				UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
					{Type: string(corev1.NodeReady), Status: string(corev1.ConditionFalse), Timeout: metav1.Duration{Duration: time.Minute}},
				},
			},
		},
		&machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "metrics"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{
				Selector:     machinistv1.LabelSelector{MatchLabels: labels},
				MaxDisrupted: intstr.FromInt32(1),
			},
		},
		&machinistv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workers"},
			Spec: machinistv1.MachineDeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "workers"}},
				Template: machinistv1.MachineTemplateSpec{
					Metadata: machinistv1.TemplateMetadata{Labels: map[string]string{"pool": "workers"}},
					Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}},
				},
			},
		},
	}
	for _, o := range objects {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", o.GetName(), err)
		}
	}

	prometheus := scraper{url: fmt.Sprintf("https://127.0.0.1:%d/metrics", port), token: readerToken(t, ctx, ns)}
	var served map[string]bool
	var missing []string
	testenv.WaitFor(t, 2*time.Minute, "every metric used served", func() error {
		families, err := prometheus.scrape()
		if err != nil {
			return err
		}
		served = families
		missing = missing[:0]
		for _, name := range used {
			if !served[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not served: %s", strings.Join(missing, ", "))
		}
		return nil
	})
	sort.Strings(used)
	t.Logf("%d metrics used by the rules and the dashboard, all served: %s", len(used), strings.Join(used, " "))

	// And true of the fleet: what the gauges say, once it has settled.
	want := []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"machinist_workload_cluster_reachable", map[string]string{"namespace": ns, "name": "edge"}, 1},
		{"machinist_machinedeployment_replicas", map[string]string{"namespace": ns, "name": "workers", "state": "desired"}, 1},
		{"machinist_machinedeployment_replicas", map[string]string{"namespace": ns, "name": "workers", "state": "ready"}, 1},
		{"machinist_disruption_budget_window_open", map[string]string{"namespace": ns, "name": "metrics"}, 1},
		{"machinist_disruption_budget_disruptions_allowed", map[string]string{"namespace": ns, "name": "metrics"}, 1},
		{"machinist_healthcheck_short_circuited", map[string]string{"namespace": ns, "name": "metrics"}, 0},
		{"machinist_machines_overdue", map[string]string{"phase": "Provisioning"}, 0},
		{"machinist_machines", map[string]string{"phase": "Running"}, 3},
	}
	testenv.WaitFor(t, 2*time.Minute, "the gauges true of the fleet", func() error {
		families, err := prometheus.families()
		if err != nil {
			return err
		}
		var wrong []string
		for _, w := range want {
			if got, ok := valueOf(families[w.name], w.labels); !ok || got != w.value {
				wrong = append(wrong, fmt.Sprintf("%s%v = %v (served %v), want %v", w.name, w.labels, got, ok, w.value))
			}
		}
		if len(wrong) > 0 {
			return errors.New(strings.Join(wrong, "; "))
		}
		return nil
	})
}

// valueOf is the value of f's series with labels (and maybe others).
func valueOf(f *dto.MetricFamily, labels map[string]string) (float64, bool) {
	if f == nil {
		return 0, false
	}
series:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue series
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// scraper reads a secure /metrics as the ServiceMonitor does: over HTTPS
// without verifying the self-signed certificate, with a bearer token.
type scraper struct {
	url, token string
}

// scrape reads /metrics and returns the names it serves, a histogram's
// series (_bucket, _sum, _count) under their own names too.
func (s scraper) scrape() (map[string]bool, error) {
	families, err := s.families()
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for name, f := range families {
		if len(f.GetMetric()) == 0 {
			continue
		}
		names[name] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			names[name+suffix] = true
		}
	}
	return names, nil
}

// families reads /metrics, by family name.
func (s scraper) families() (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequest(http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", s.url, resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(strings.NewReader(string(body)))
}

// readerToken is a token of a ServiceAccount in ns bound, as a Prometheus'
// is, to the ClusterRole machinist-metrics-reader of config/rbac.
func readerToken(t *testing.T, ctx context.Context, ns string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "rbac", "metrics_reader.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := sigsyaml.Unmarshal(raw, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa.Name}},
	}
	for _, o := range []client.Object{sa, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), binding) })
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return token.Status.Token
}
