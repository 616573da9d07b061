package security_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/api/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
)

// endless is a body of size bytes of JSON-ish filler that counts what
// was read of it, made as it is read so that the test holds none of it.
type endless struct {
	size, read int64
	n          atomic.Int64
}

func (b *endless) Read(p []byte) (int, error) {
	if b.read >= b.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), b.size-b.read))
	for i := range n {
		p[i] = ' '
	}
	if b.read == 0 && n > 0 {
		p[0] = '['
	}
	b.read += int64(n)
	b.n.Add(int64(n))
	return n, nil
}

// The conversion webhook answers anyone (kube-apiserver calls it without
// credentials): a body of 100 MiB is refused with 413, having been read
// no further than the limit and what the sockets buffer.
func TestConvertRefusesAHugeBody(t *testing.T) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(verbs.Server.CABundle)
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	body := &endless{size: 100 << 20}
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("https://127.0.0.1:%d%s", verbs.Server.Port, apiserver.ConversionPath), body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = body.size
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("a 100 MiB body: %v (after %d bytes); want a 413", err, body.n.Load())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		t.Errorf("a 100 MiB body: %d %s; want 413", resp.StatusCode, answer)
	}
	// The server read at most its limit; the rest of what left the test
	// sat in the two sockets' buffers.
	const bound = 16 << 20
	if n := body.n.Load(); n > bound {
		t.Errorf("%d MiB of the body were sent before the answer; want at most %d MiB", n>>20, bound>>20)
	}
	t.Logf("answered %d after %.1f MiB of the 100 MiB body had been sent", resp.StatusCode, float64(body.n.Load())/(1<<20))
}

// /metrics tells how many Machines there are, in which namespaces and
// clusters, and what they are doing: it is served only to those
// kube-apiserver authenticates and allows the /metrics URL.
func TestMetricsNeedCredentials(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, "metrics")
	token := func(sa string) string {
		t.Helper()
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
			t.Fatal(err)
		}
		tr, err := kube(t).CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	nobody, prometheus := token("nobody"), token("prometheus")
	reader := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
	}
	if err := env.Client.Create(ctx, reader); err != nil {
		t.Fatal(err)
	}
	// A metric every manager serves (the tests' managers keep Machinist's
	// own in registries of their own, one per manager).
	const metric = "rest_client_requests_total"
	// The manager's certificate is its own: what is tested here is who
	// may read, not whom the scraper trusts.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scrape := func(token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", metricsPort), nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	for _, tc := range []struct {
		who   string
		token string
		want  []int
	}{
		{"no credentials", "", []int{http.StatusUnauthorized}},
		{"a token not allowed /metrics", nobody, []int{http.StatusForbidden}},
		{"a forged token", "not-a-token", []int{http.StatusUnauthorized}},
	} {
		code, body, err := scrape(tc.token)
		if err != nil || !slices.Contains(tc.want, code) {
			t.Errorf("/metrics with %s: %d %q, %v; want %v", tc.who, code, body[:min(len(body), 200)], err, tc.want)
		}
		if strings.Contains(body, metric) {
			t.Errorf("/metrics with %s served metrics", tc.who)
		}
	}
	code, body, err := scrape(prometheus)
	if err != nil || code != http.StatusOK || !strings.Contains(body, metric) {
		t.Errorf("/metrics with the metrics reader's token: %d, %v, %d bytes; want 200 and the controllers' metrics", code, err, len(body))
	}
}

// A capacity name reaches a provider that may put it on a command line (a
// qemu VM's kernel command line): only resource names are accepted, at
// either API version, so a name with a space cannot add arguments.
func TestACapacityNameCannotCarryArguments(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, "capacity")
	bad := corev1.ResourceName("cpu --kubeconfig=/etc/machinist/manager.kubeconfig")
	beta := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "beta"},
		Spec: machinistv1.MachineClassSpec{Provider: "qemu", NodeTemplate: &machinistv1.NodeTemplate{
			Capacity: corev1.ResourceList{bad: resource.MustParse("1")},
		}},
	}
	alpha := &v1alpha1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha"},
		Spec: v1alpha1.MachineClassSpec{Provider: "qemu", NodeTemplate: &v1alpha1.NodeTemplate{
			Capacity: corev1.ResourceList{bad: resource.MustParse("1")},
		}},
	}
	for _, o := range []client.Object{beta, alpha} {
		err := as(tenant).Create(ctx, o)
		var status apierrors.APIStatus
		if !apierrors.IsInvalid(err) || !errors.As(err, &status) || !strings.Contains(err.Error(), "capacity") {
			t.Errorf("class %s with capacity %q: %v; want Invalid, naming capacity", o.GetName(), bad, err)
		}
	}
	// Resource names of every kind still pass.
	good := beta.DeepCopy()
	good.Name, good.ResourceVersion = "good", ""
	good.Spec.NodeTemplate.Capacity = corev1.ResourceList{
		"cpu": resource.MustParse("2"), "memory": resource.MustParse("1Gi"), "nvidia.com/gpu": resource.MustParse("1"),
		"hugepages-2Mi": resource.MustParse("64Mi"), "ephemeral-storage": resource.MustParse("10Gi"), "pods": resource.MustParse("110"),
	}
	if err := as(tenant).Create(ctx, good); err != nil {
		t.Errorf("a class with well-formed capacity names: %v", err)
	}
}

var _ runtime.Object = (*machinistv1.MachineClass)(nil)
