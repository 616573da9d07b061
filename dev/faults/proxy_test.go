package faults_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

// through starts a proxy with rules in front of the test's kube-apiserver
// and returns it with a clientset that reaches kube-apiserver through it.
func through(t *testing.T, rules ...faults.Rule) (*faults.Proxy, kubernetes.Interface) {
	t.Helper()
	p, err := faults.Start(env.Config, faults.Config{Seed: 7, Rules: rules}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	kube, err := kubernetes.NewForConfig(p.Config())
	if err != nil {
		t.Fatal(err)
	}
	return p, kube
}

func configMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}
}

// direct reads past the proxy.
func direct(t *testing.T) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

func TestTheProxyCarriesClientGoOverTLSAndHTTP2(t *testing.T) {
	p, kube := through(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	w, err := kube.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, configMap("a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-w.ResultChan():
		if e.Type != watch.Added {
			t.Fatalf("watch through the proxy: got %s, want ADDED", e.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event through the proxy in 10s")
	}
	// The protocol the client actually spoke.
	rt, err := rest.TransportFor(p.Config())
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, p.URL+"/api/v1/namespaces/"+ns+"/configmaps", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("got %s over %s, want 200 over HTTP/2", resp.Status, resp.Proto)
	}
	// A kubeconfig, for kubectl or a manager of one's own.
	raw, err := p.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	viaFile, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := viaFile.CoreV1().ConfigMaps(ns).Get(ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the proxy's kubeconfig: %v", err)
	}
}

func TestTheProxyAdmitsOnlyItsOwnClients(t *testing.T) {
	p, _ := through(t)
	cfg := p.Config()
	// Trusts the proxy but brings no certificate of the proxy's CA.
	tlsCfg, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 10 * time.Second}
	resp, err := c.Get(p.URL + "/api/v1/namespaces")
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("a client without the proxy's certificate got %s", resp.Status)
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		t.Fatalf("the client refused the proxy, not the other way round: %v", err)
	}
}

func TestALostReplyWasStored(t *testing.T) {
	p, kube := through(t, faults.Rule{Name: "lose", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"configmaps"}, Rate: 1, Limit: 1})
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, configMap("lost"), metav1.CreateOptions{})
	if err == nil {
		t.Fatal("the Create's reply was not lost")
	}
	if _, ok := err.(apierrors.APIStatus); ok {
		t.Fatalf("a lost reply must look like a broken connection, not an answer: %v", err)
	}
	if _, err := direct(t).CoreV1().ConfigMaps(ns).Get(ctx, "lost", metav1.GetOptions{}); err != nil {
		t.Fatalf("the Create whose reply was lost was not stored: %v", err)
	}
	if n := p.Struck("lose"); n != 1 {
		t.Fatalf("counted %d lost replies, want 1", n)
	}
	// The limit is spent: the next passes.
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, configMap("next"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestALateCommitIsStoredAfterIts504(t *testing.T) {
	p, kube := through(t, faults.Rule{Name: "late", Fault: faults.LateCommit, Verbs: []string{"create"}, Resources: []string{"configmaps"}, Rate: 1, Limit: 1,
		Delay: metav1.Duration{Duration: 2 * time.Second}})
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, configMap("late"), metav1.CreateOptions{})
	if !apierrors.IsTimeout(err) {
		t.Fatalf("got %v, want kube-apiserver's 504 Timeout", err)
	}
	if _, err := direct(t).CoreV1().ConfigMaps(ns).Get(ctx, "late", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("stored before its time: %v", err)
	}
	settle, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Settle(settle); err != nil {
		t.Fatal(err)
	}
	if _, err := direct(t).CoreV1().ConfigMaps(ns).Get(ctx, "late", metav1.GetOptions{}); err != nil {
		t.Fatalf("never stored: %v", err)
	}
	if stored, refused := p.Late(); stored != 1 || refused != 0 {
		t.Fatalf("late requests: %d stored, %d refused; want 1, 0", stored, refused)
	}
}

func TestUnavailableStoresNothingAndThrottleIsRetried(t *testing.T) {
	p, kube := through(t,
		faults.Rule{Name: "503", Fault: faults.Unavailable, Verbs: []string{"create"}, Resources: []string{"configmaps"}, Namespaces: []string{"nowhere"}, Rate: 1},
		faults.Rule{Name: "429", Fault: faults.Throttle, Verbs: []string{"create"}, Resources: []string{"configmaps"}, Rate: 1, Limit: 2, Delay: metav1.Duration{Duration: time.Second}},
	)
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	// Namespaces limit a rule: this one passes the 503 rule by, and
	// client-go waits out both 429s by itself, as it does API Priority
	// and Fairness's.
	began := time.Now()
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, configMap("throttled"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("client-go did not retry the 429s: %v", err)
	}
	if waited := time.Since(began); waited < 2*time.Second {
		t.Fatalf("client-go waited %v, less than the two Retry-After of 1s", waited)
	}
	if n := p.Struck("429"); n != 2 {
		t.Fatalf("throttled %d times, want 2", n)
	}
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nowhere"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = kube.CoreV1().ConfigMaps("nowhere").Create(ctx, configMap("refused"), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("got %v, want 503", err)
	}
	if _, err := direct(t).CoreV1().ConfigMaps("nowhere").Get(ctx, "refused", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a request refused with 503 before it was forwarded was stored: %v", err)
	}
}

func TestAWatchIsCutMidStream(t *testing.T) {
	p, kube := through(t, faults.Rule{Name: "cut", Fault: faults.CutWatch, Resources: []string{"configmaps"}, Rate: 1, Limit: 1,
		Delay: metav1.Duration{Duration: 500 * time.Millisecond}})
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	w, err := kube.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, open := <-w.ResultChan():
			if !open {
				if n := p.Struck("cut"); n != 1 {
					t.Fatalf("counted %d cut watches, want 1", n)
				}
				return
			}
		case <-deadline:
			t.Fatal("the watch was not cut within 10s")
		}
	}
}

func TestLatencyDelaysTheRequest(t *testing.T) {
	_, kube := through(t, faults.Rule{Fault: faults.Latency, Verbs: []string{"get"}, Resources: []string{"namespaces"}, Rate: 1,
		Delay: metav1.Duration{Duration: 700 * time.Millisecond}})
	began := time.Now()
	if _, err := kube.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < 700*time.Millisecond {
		t.Fatalf("answered in %v, before the 700ms of latency", took)
	}
}

func TestLoadReadsRulesAndSaysWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good.yaml"
	if err := os.WriteFile(good, []byte(`seed: 3
rules:
- name: lose-creates
  fault: LoseReply
  verbs: [create]
  resources: [machines]
  rate: 0.01
- fault: CutWatch
  rate: 0.5
  delay: 30s
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := faults.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if c.Seed != 3 || len(c.Rules) != 2 || c.Rules[1].Delay.Duration != 30*time.Second {
		t.Fatalf("read %+v", c)
	}
	bad := dir + "/bad.yaml"
	if err := os.WriteFile(bad, []byte(`rules:
- fault: LoseReplies
  rate: 2
- fault: Latency
  rate: 0.1
- fault: CutWatch
  verbs: [get]
  rate: 1
  delay: 1s
- fault: Throttle
  ratio: 1
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = faults.Load(bad)
	if err == nil {
		t.Fatal("a bad file was accepted")
	}
	// An unknown field is refused first, before any rule is judged.
	if want := `unknown field "ratio"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("got %q, want it to say %s", err, want)
	}
	err = faults.Config{Rules: []faults.Rule{
		{Fault: "LoseReplies", Rate: 2},
		{Fault: faults.Latency, Rate: 0.1},
		{Fault: faults.CutWatch, Verbs: []string{"get"}, Rate: 1, Delay: metav1.Duration{Duration: time.Second}},
	}}.Validate()
	for _, want := range []string{
		`rules[0]: fault "LoseReplies" is not one of`,
		"rules[0]: rate 2 must be above 0 and at most 1",
		"rules[1]: fault Latency needs a delay",
		"rules[2]: fault CutWatch strikes only watches",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %q", err, want)
		}
	}
}

func TestALaggingWatchDeliversEveryEventLate(t *testing.T) {
	_, kube := through(t, faults.Rule{Fault: faults.Latency, Verbs: []string{"watch"}, Resources: []string{"configmaps"}, Rate: 1,
		Delay: metav1.Duration{Duration: time.Second}})
	ctx := context.Background()
	ns := env.NewNamespace(t, "faults")
	w, err := kube.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, name := range []string{"a", "b"} {
		created := time.Now()
		if _, err := direct(t).CoreV1().ConfigMaps(ns).Create(ctx, configMap(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-w.ResultChan():
			if lag := time.Since(created); e.Type != watch.Added || lag < time.Second {
				t.Fatalf("%s: got %s after %v, want ADDED a second or more after the create", name, e.Type, lag)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no event in 10s", name)
		}
	}
}
