package security_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/pki"
)

// listener is an HTTPS server the test runs where a tenant's kubeconfig
// points: whatever the manager sends it is recorded.
type listener struct {
	*httptest.Server
	// caPEM verifies its serving certificate.
	caPEM []byte

	mu sync.Mutex
	// requests counts what reached it; authorization holds each
	// request's Authorization header.
	requests      int
	authorization []string
}

// listen starts a listener that answers every request with code and body
// (text/plain).
func listen(t *testing.T, code int, body string) *listener {
	t.Helper()
	l := &listener{}
	l.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.requests++
		l.authorization = append(l.authorization, r.Header.Get("Authorization"))
		l.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	l.StartTLS()
	t.Cleanup(l.Close)
	l.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: l.Certificate().Raw})
	return l
}

// seen is what reached the listener so far.
func (l *listener) seen() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests, append([]string(nil), l.authorization...)
}

// kubeconfig is a kubeconfig of one cluster, user and context, with the
// cluster's server and CA data from the listener, changed by edit.
func (l *listener) kubeconfig(t *testing.T, edit func(*clientcmdapi.Cluster, *clientcmdapi.AuthInfo)) []byte {
	t.Helper()
	cluster := &clientcmdapi.Cluster{Server: l.URL, CertificateAuthorityData: l.caPEM}
	auth := &clientcmdapi.AuthInfo{Token: "the-tenants-own-token"}
	edit(cluster, auth)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"], cfg.AuthInfos["u"] = cluster, auth
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// hand gives the manager a WorkloadCluster named name in ns whose Secret
// holds kubeconfig, as a tenant would, and a Machine for it, so that the
// manager connects. It returns the WorkloadCluster.
func hand(t *testing.T, ns, name string, kubeconfig []byte) *machinistv1.WorkloadCluster {
	t.Helper()
	ctx := context.Background()
	c := as(tenant)
	wc, err := testenv.RegisterCluster(ctx, c, ns, name, kubeconfig)
	if err != nil {
		t.Fatalf("the tenant handing over its cluster: %v", err)
	}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-machine"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, ClusterName: name},
	}
	if err := c.Create(ctx, m); err != nil {
		t.Fatalf("the tenant creating Machine %s: %v", m.Name, err)
	}
	return wc
}

// refused waits until wc is not Reachable, then a few probe periods more
// (a refusal written once and a command run at the next attempt would
// otherwise pass), and returns the condition.
func refused(t *testing.T, wc *machinistv1.WorkloadCluster) *metav1.Condition {
	t.Helper()
	testenv.WaitForObject(t, env.Client, time.Minute, wc.Name+" not Reachable", wc, func(wc *machinistv1.WorkloadCluster) error {
		if c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("Reachable %+v", c)
		}
		return nil
	})
	time.Sleep(3 * 2 * time.Second)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(wc), wc); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
}

// says checks that c has reason and its message each of says.
func says(t *testing.T, c *metav1.Condition, reason string, says ...string) {
	t.Helper()
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason {
		t.Errorf("Reachable %+v; want False, reason %s", c, reason)
		return
	}
	for _, s := range says {
		if !strings.Contains(c.Message, s) {
			t.Errorf("Reachable's message %q does not say %q", c.Message, s)
		}
	}
}

// A kubeconfig's exec plugin would run a command in the manager with the
// manager's own files, network and credentials: it is refused, and the
// command never runs.
func TestAKubeconfigsExecPluginDoesNotRun(t *testing.T) {
	ns := tenantNamespace(t, "exec", "exec-kubeconfig")
	l := listen(t, http.StatusOK, `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`)
	marker := filepath.Join(t.TempDir(), "ran")
	kubeconfig := l.kubeconfig(t, func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
		u.Token = ""
		u.Exec = &clientcmdapi.ExecConfig{
			APIVersion:      "client.authentication.k8s.io/v1",
			Command:         "/bin/sh",
			Args:            []string{"-c", "touch " + marker + `; echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'`},
			InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		}
	})
	wc := hand(t, ns, "exec", kubeconfig)
	c := refused(t, wc)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the kubeconfig's exec plugin ran in the manager")
	}
	if n, auth := l.seen(); n > 0 {
		t.Errorf("the manager sent %d requests to the server of a refused kubeconfig, with Authorization %q", n, auth)
	}
	says(t, c, machinistv1.ReasonKubeconfigRefused, "users[u].user.exec", "--insecure-kubeconfig-exec")
}

// No file of the manager's is read on a tenant's word: a token file (the
// manager's own ServiceAccount token, say) never reaches the server the
// tenant names, and no CA, certificate or key is read from a path; nor
// is TLS verification turned off. Each is refused with the field named.
func TestAKubeconfigReadsNoFileAndKeepsTLS(t *testing.T) {
	dir := t.TempDir()
	// A credential of the manager's, in a file as a ServiceAccount token is.
	stolen := "managers-token-" + rand.String(16)
	tokenFile := filepath.Join(dir, "token")
	write(t, tokenFile, []byte(stolen))
	cases := []struct {
		name  string
		edit  func(l *listener, c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo)
		field string
	}{
		{"token-file", func(_ *listener, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.TokenFile = "", tokenFile
		}, "users[u].user.tokenFile"},
		{"ca-file", func(l *listener, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			// The CA that verifies the listener, so that a manager that
			// reads the file connects.
			file := filepath.Join(dir, "ca.crt")
			write(t, file, l.caPEM)
			c.CertificateAuthorityData, c.CertificateAuthority = nil, file
		}, "clusters[c].cluster.certificate-authority"},
		{"client-cert-files", func(_ *listener, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			ca, err := pki.NewCA("someone")
			if err != nil {
				t.Fatal(err)
			}
			pair, err := ca.Issue(pki.Request{CommonName: "someone"})
			if err != nil {
				t.Fatal(err)
			}
			cert, key := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
			write(t, cert, pair.CertPEM)
			write(t, key, pair.KeyPEM)
			u.Token, u.ClientCertificate, u.ClientKey = "", cert, key
		}, "users[u].user.client-certificate"},
		{"insecure", func(_ *listener, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData, c.InsecureSkipTLSVerify = nil, true
		}, "clusters[c].cluster.insecure-skip-tls-verify"},
	}
	ns := tenantNamespace(t, "files", "token-file-kubeconfig", "ca-file-kubeconfig", "client-cert-files-kubeconfig", "insecure-kubeconfig")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, http.StatusOK, `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`)
			kubeconfig := l.kubeconfig(t, func(c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) { tc.edit(l, c, u) })
			wc := hand(t, ns, tc.name, kubeconfig)
			c := refused(t, wc)
			n, auth := l.seen()
			for _, a := range auth {
				if strings.Contains(a, stolen) {
					t.Errorf("the manager's token file reached the tenant's server: Authorization %q", a)
				}
			}
			if n > 0 {
				t.Errorf("the manager sent %d requests to the server of a refused kubeconfig", n)
			}
			says(t, c, machinistv1.ReasonKubeconfigRefused, tc.field)
		})
	}
}

// A server that is not a kube-apiserver (or an address inside the
// manager's network the tenant wants to read) is reported by its status
// code, never by what it answered.
func TestAForeignServersAnswerIsNotEchoed(t *testing.T) {
	ns := tenantNamespace(t, "echo", "echo-kubeconfig")
	secret := "internal-page-" + rand.String(16)
	l := listen(t, http.StatusInternalServerError, "the answer of an internal service: "+secret)
	wc := hand(t, ns, "echo", l.kubeconfig(t, func(*clientcmdapi.Cluster, *clientcmdapi.AuthInfo) {}))
	c := refused(t, wc)
	if c != nil && strings.Contains(c.Message, secret) {
		t.Errorf("Reachable's message echoes the server's answer: %q", c.Message)
	}
	says(t, c, machinistv1.ReasonUnreachable, "500")
	if n, _ := l.seen(); n == 0 {
		t.Error("the manager never asked the server, so the test proves nothing")
	}
	testenv.WaitFor(t, 30*time.Second, "the WorkloadCluster's Warning Event", func() error {
		var events corev1.EventList
		if err := env.Client.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		warned := false
		for _, e := range events.Items {
			if e.InvolvedObject.Name != wc.Name {
				continue
			}
			if strings.Contains(e.Message, secret) {
				return fmt.Errorf("Event %s echoes the server's answer: %q", e.Reason, e.Message)
			}
			warned = warned || e.Type == corev1.EventTypeWarning
		}
		if !warned {
			return fmt.Errorf("no Warning Event yet")
		}
		return nil
	})
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
