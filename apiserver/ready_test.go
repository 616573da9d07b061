package apiserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/internal/pki"
)

// A verbs server reads the front proxy's CA with an informer that starts
// with it; until that has synced, what the aggregator forwards fails
// authentication (and the server logs an error for each request). The
// server must say it is not ready until then, and WaitReady (which
// RegisterLocal uses before it creates the APIService) must not return
// before. The fault proxy holds the informer's list back, so that the
// window is seconds wide rather than the milliseconds of an idle host.
func TestNotReadyUntilItCanAuthenticateTheAggregator(t *testing.T) {
	g := NewWithT(t)
	const hold = 8 * time.Second
	proxy, err := faults.Start(env.Config, faults.Config{Rules: []faults.Rule{{
		Name: "slow-ca", Fault: faults.Latency, Verbs: []string{"list", "watch"}, Resources: []string{"configmaps"},
		Namespaces: []string{metav1.NamespaceSystem}, Rate: 1, Delay: metav1.Duration{Duration: hold},
	}}}, "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = proxy.Close() })
	raw, err := proxy.Kubeconfig()
	g.Expect(err).NotTo(HaveOccurred())
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(os.WriteFile(kubeconfig, raw, 0o600)).To(Succeed())

	srv, err := apiserver.New(apiserver.Options{CertDir: t.TempDir(), Kubeconfig: kubeconfig})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(srv.CABundle)).To(BeTrue())
	frontProxy, err := env.FrontProxyClient()
	g.Expect(err).NotTo(HaveOccurred())
	aggregator := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{frontProxy}}}}
	// A kubelet's probe presents no certificate.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	base := fmt.Sprintf("https://127.0.0.1:%d", srv.Port)
	// What the aggregator's availability check asks, as alice.
	discovery := func() (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/apis/"+subresourcesv1.SchemeGroupVersion.String(), nil)
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("X-Remote-User", operator)
		req.Header.Set("X-Remote-Group", "system:authenticated")
		return do(g, aggregator, req)
	}
	readyz := func() (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz?verbose", nil)
		g.Expect(err).NotTo(HaveOccurred())
		return do(g, probe, req)
	}

	// While the CA is held back: not ready, and the aggregator refused.
	started := time.Now()
	var code int
	var body string
	g.Eventually(func(g Gomega) {
		resp, err := probe.Get(base + "/readyz?verbose")
		g.Expect(err).NotTo(HaveOccurred(), "the server is listening")
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		code, body = resp.StatusCode, string(b)
	}).WithTimeout(hold / 2).Should(Succeed())
	g.Expect(time.Since(started)).To(BeNumerically("<", hold/2), "the window this test needs")
	g.Expect(code).To(Equal(http.StatusInternalServerError), body)
	g.Expect(body).To(ContainSubstring("[-]front-proxy-ca failed"))
	code, body = discovery()
	g.Expect(code).To(Equal(http.StatusUnauthorized), "a forwarded request before the CA is loaded: %s", body)

	// WaitReady returns once the aggregator's requests authenticate.
	g.Expect(srv.WaitReady(ctx, time.Minute)).To(Succeed())
	code, body = discovery()
	g.Expect(code).To(Equal(http.StatusOK), body)
	code, body = readyz()
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(body).To(ContainSubstring("[+]front-proxy-ca ok"))
}

func do(g Gomega, c *http.Client, req *http.Request) (int, string) {
	resp, err := c.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(b)
}

// A client certificate the server does not trust, from a CA with the same
// name as the front proxy's (what a foreign process may hold), is refused,
// and the error logged for it says where it came from and who issued it:
// a stranger on the port is told apart from the aggregator.
func TestRefusedCertificateNamesItsSender(t *testing.T) {
	g := NewWithT(t)
	frontProxy, err := env.FrontProxyClient()
	g.Expect(err).NotTo(HaveOccurred())
	issuer, err := x509.ParseCertificate(frontProxy.Certificate[0])
	g.Expect(err).NotTo(HaveOccurred())
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	g.Expect(err).NotTo(HaveOccurred())
	namesake, err := cert.NewSelfSignedCACert(cert.Config{CommonName: issuer.Issuer.CommonName}, key)
	g.Expect(err).NotTo(HaveOccurred())
	kp, err := (&pki.CA{Cert: namesake, Key: key}).Issue(pki.Request{CommonName: "stranger", Client: true})
	g.Expect(err).NotTo(HaveOccurred())
	stranger, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	g.Expect(err).NotTo(HaveOccurred())

	var mu sync.Mutex
	var logged []string
	klog.SetLogger(funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(verbs.Server.CABundle)).To(BeTrue())
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{stranger}}}}
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/apis/%s", verbs.Server.Port, subresourcesv1.SchemeGroupVersion), nil)
	g.Expect(err).NotTo(HaveOccurred())
	code, body := do(g, c, req)
	g.Expect(code).To(Equal(http.StatusUnauthorized), body)
	g.Eventually(func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), logged...)
	}).Should(ContainElement(And(ContainSubstring("Unable to authenticate the request"), ContainSubstring("from 127.0.0.1:"),
		ContainSubstring(fmt.Sprintf(`client certificate \"CN=stranger\" issued by \"CN=%s\"`, issuer.Issuer.CommonName)))))
}
