package manager_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

// TestSecureMetricsAnswerOnlyAuthorizedScrapers runs a manager with
// MetricsSecure as a ServiceAccount bound to the generated machinist-manager
// ClusterRole, so that it asks kube-apiserver about each scraper with only
// the permissions config/rbac gives it, and serving a certificate from
// MetricsCertDir. Over HTTPS with that certificate: no token is 401, a
// token kube-apiserver did not issue 401; the token of a ServiceAccount
// not allowed /metrics is 403; that of one bound to machinist-metrics-reader
// gets the metrics, over HTTP/1.1. Plain HTTP is refused.
func TestSecureMetricsAnswerOnlyAuthorizedScrapers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := env.NewNamespace(t, "metrics")
	managerRole := clusterRole(t, ctx, "role.yaml")
	readerRole := clusterRole(t, ctx, "metrics_reader.yaml")
	for _, sa := range []string{"manager", "prometheus", "stranger"} {
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
			t.Fatal(err)
		}
	}
	bind(t, ctx, ns, "manager", managerRole)
	bind(t, ctx, ns, "prometheus", readerRole)

	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":manager",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	certDir := t.TempDir()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	// controller-runtime's registry, the one /metrics serves: only this
	// test's manager may register there in this process.
	start(t, ctx, cfg, manager.Options{MetricsAddr: addr, MetricsSecure: true, MetricsCertDir: certDir})

	// Trusting the certificate written to MetricsCertDir and nothing else.
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(certPEM) {
		t.Fatal("no certificate in the generated PEM")
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost"},
		// Offered, so that the server's refusal of HTTP/2 shows.
		ForceAttemptHTTP2: true,
	}}
	url := "https://" + addr + "/metrics"
	testenv.WaitFor(t, time.Minute, "the metrics server answering", func() error {
		code, _, _, err := get(hc, url, "")
		if err != nil {
			return err
		}
		if code != http.StatusUnauthorized {
			return fmt.Errorf("GET %s without a token: %d", url, code)
		}
		return nil
	})

	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token kube-apiserver did not issue", "not-a-token", http.StatusUnauthorized},
		{"a ServiceAccount not allowed /metrics", token("stranger"), http.StatusForbidden},
		{"a ServiceAccount bound to machinist-metrics-reader", token("prometheus"), http.StatusOK},
	} {
		code, proto, body, err := get(hc, url, tc.token)
		if err != nil {
			t.Fatalf("%s: %v", tc.who, err)
		}
		if code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.who, code, firstLine(body), tc.want)
			continue
		}
		if proto != 1 {
			t.Errorf("%s: answered over HTTP/%d, want HTTP/1.1", tc.who, proto)
		}
		if code != http.StatusOK {
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: parsing /metrics: %v", tc.who, err)
		}
		for _, name := range []string{"machinist_machine_transitions_total", "rest_client_requests_total", "go_goroutines"} {
			if len(families[name].GetMetric()) == 0 {
				t.Errorf("%s: /metrics serves no %s", tc.who, name)
			}
		}
	}

	// Plain HTTP reaches no metrics: Go's TLS server answers it 400 and
	// hangs up (so reading the body may fail).
	code, _, body, err := get(&http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/metrics", token("prometheus"))
	if code != http.StatusBadRequest {
		t.Errorf("GET over plain HTTP: %d %s (%v), want 400", code, firstLine(body), err)
	}
}

// TestSecureMetricsWithoutACertDirAreSelfSigned plants a certificate
// where controller-runtime looks for one by default (under $TMPDIR), as
// another user of a shared host could: a manager given no MetricsCertDir
// serves a certificate of its own, not that one. Given a MetricsCertDir
// without a certificate, it refuses to start.
func TestSecureMetricsWithoutACertDirAreSelfSigned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	planted := filepath.Join(tmp, "k8s-metrics-server", "serving-certs")
	if err := os.MkdirAll(planted, 0o755); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(planted, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plantedCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}

	_, err = manager.New(ctx, env.Config, env.Scheme, manager.Options{
		Actuators: providers.NewRegistry(), Registry: prometheus.NewRegistry(), Repeatable: true,
		MetricsAddr: "127.0.0.1:0", MetricsSecure: true, MetricsCertDir: t.TempDir(),
	})
	if err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Errorf("a manager given an empty MetricsCertDir: %v, want an error naming tls.crt", err)
	}

	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	start(t, ctx, env.Config, manager.Options{Registry: prometheus.NewRegistry(), MetricsAddr: addr, MetricsSecure: true})
	var served []byte
	testenv.WaitFor(t, time.Minute, "the metrics server's certificate", func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		served = conn.ConnectionState().PeerCertificates[0].Raw
		return nil
	})
	if string(served) == string(plantedCert.Certificate[0]) {
		t.Errorf("the manager serves the certificate planted in %s", planted)
	}
	cert, err := x509.ParseCertificate(served)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("the self-signed certificate: %v", err)
	}
}

// start runs a manager with opts as cfg until the test ends.
func start(t *testing.T, ctx context.Context, cfg *rest.Config, opts manager.Options) {
	t.Helper()
	opts.Actuators, opts.Repeatable = providers.NewRegistry(), true
	mgr, err := manager.New(ctx, cfg, env.Scheme, opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the manager: %v", err)
		}
	})
}

// clusterRole creates the ClusterRole of config/rbac/file and returns its
// name.
func clusterRole(t *testing.T, ctx context.Context, file string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(env.Root, "config", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if err := env.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return role.Name
}

// bind binds ServiceAccount ns/sa to ClusterRole role until the test ends.
func bind(t *testing.T, ctx context.Context, ns, sa, role string) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), b, client.PropagationPolicy(metav1.DeletePropagationBackground))
	})
}

// get sends GET url with token as a bearer token ("": none) and returns
// the status, the HTTP major version and the body.
func get(hc *http.Client, url, token string) (int, int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.ProtoMajor, string(body), err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
