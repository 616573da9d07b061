package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// TestMetricsNeedTheMetricsReader reads the verbs server's own /metrics
// directly, as a scraper would: refused without credentials (401) and to
// a ServiceAccount allowed nothing (403), served to one bound to the
// generated machinist-metrics-reader ClusterRole, which is all a scraper
// of the manager needs too.
func TestMetricsNeedTheMetricsReader(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := env.NewNamespace(t, "metrics")

	raw, err := os.ReadFile(filepath.Join(env.Root, "config", "rbac", "metrics_reader.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{}
	g.Expect(yaml.Unmarshal(raw, role)).To(Succeed())
	if err := env.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, sa := range []string{"prometheus", "nobody"} {
		g.Expect(env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})).To(Succeed())
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
	}
	g.Expect(env.Client.Create(ctx, binding)).To(Succeed())
	defer func() { _ = env.Client.Delete(context.Background(), binding) }()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	token := func(sa string) string {
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return tr.Status.Token
	}

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(verbs.Server.CABundle)).To(BeTrue())
	direct := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", verbs.Server.Port)
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no credentials", "", http.StatusUnauthorized},
		{"a ServiceAccount allowed nothing", token("nobody"), http.StatusForbidden},
		{"a ServiceAccount bound to machinist-metrics-reader", token("prometheus"), http.StatusOK},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		g.Expect(err).NotTo(HaveOccurred())
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := direct.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(tc.want), "%s: %s", tc.who, body)
		if tc.want == http.StatusOK {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(families).To(HaveKey(HavePrefix("apiserver_")), "%s: the server's own metrics", tc.who)
		}
	}
}
