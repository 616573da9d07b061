package deploy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// process is a machinist command running as its own process.
type process struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// machinist starts the binary (testenv builds it once) with args.
func machinist(t *testing.T, args ...string) *process {
	t.Helper()
	binary, err := testenv.Machinist()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: exec.Command(binary, args...), done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// terminate sends SIGTERM, as the kubelet does, and waits for exit code 0.
func (p *process) terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, p.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGTERM:\n%s", p.output())
	}
}

func get(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestManagerCommand runs `machinist manager` as the Deployment does: with
// leader election, probes, metrics and JSON logs, and checks each, that it
// drives a Machine to Running, and that SIGTERM stops it cleanly and hands
// the leader Lease over.
func TestManagerCommand(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	metrics, health := testenv.FreePort(t), testenv.FreePort(t)
	ns := env.NewNamespace(t, "manager")
	p := machinist(t, "manager", "--kubeconfig", env.Kubeconfig, "--leader-elect", "--leader-election-namespace", ns,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health),
		"--machine-workers=2", "--set-workers=1", "--log-format=json")

	g.Eventually(func() (int, error) {
		code, _, err := get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		return code, err
	}).WithTimeout(time.Minute).Should(Equal(http.StatusOK), p.output)
	code, _, err := get(fmt.Sprintf("http://127.0.0.1:%d/healthz", health))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(http.StatusOK))

	lease := &coordinationv1.Lease{}
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "machinist-manager"}, lease)).To(Succeed())
		g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
		g.Expect(*lease.Spec.HolderIdentity).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).Should(Succeed())

	g.Expect(env.InmemoryClass(ctx, ns, "small", "{}")).To(Succeed())
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m0"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}},
	}
	g.Expect(env.Client.Create(ctx, m)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
	}).WithTimeout(time.Minute).Should(Succeed(), p.output)

	// The transition is counted just after the status that stores it.
	g.Eventually(func(g Gomega) {
		_, body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(body).To(ContainSubstring(`machinist_machine_transitions_total{event="provisioned",from="Provisioning",to="Running"} `))
	}).WithTimeout(10 * time.Second).Should(Succeed())

	p.terminate(t)
	for _, line := range strings.Split(strings.TrimSpace(p.output()), "\n") {
		if strings.HasPrefix(line, "{") {
			var entry map[string]any
			g.Expect(json.Unmarshal([]byte(line), &entry)).To(Succeed(), line)
			g.Expect(entry).To(HaveKey("msg"))
		}
	}
	g.Expect(p.output()).To(ContainSubstring(`"msg":"Starting workers"`), "structured logs")
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "machinist-manager"}, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(Or(BeNil(), HaveValue(BeEmpty())), "the Lease is released on a clean stop")
}

// TestAPIServerCommand runs `machinist apiserver --apiservice` against an
// APIService deployed without a caBundle, as config/default deploys it,
// and checks the server fills the caBundle in and becomes Available.
func TestAPIServerCommand(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	port := testenv.FreePort(t)
	svc := types.NamespacedName{Namespace: "machinist-system", Name: "machinist-verbs"}
	// Here the server runs as the administrator; in a cluster, as the
	// machinist-verbs ServiceAccount whose RBAC deploy_test.go checks.
	err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svc.Namespace}})
	g.Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	g.Expect(env.Client.Patch(ctx, apiserver.LocalService(svc, int32(port)), client.Apply, client.FieldOwner("test"), client.ForceOwnership)).To(Succeed())
	registration := apiserver.APIService(svc, int32(port), nil)
	g.Expect(env.Client.Patch(ctx, registration, client.Apply, client.FieldOwner("test"), client.ForceOwnership)).To(Succeed())
	t.Cleanup(func() {
		_ = env.Client.Delete(ctx, &apiregv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: apiserver.APIServiceName}})
		_ = env.Client.Delete(ctx, apiserver.LocalService(svc, int32(port)))
	})

	p := machinist(t, "apiserver", "--kubeconfig", env.Kubeconfig, "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir", t.TempDir(), "--service", svc.String(), "--apiservice", apiserver.APIServiceName, "--log-format=json")
	g.Eventually(func(g Gomega) {
		got := &apiregv1.APIService{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: apiserver.APIServiceName}, got)).To(Succeed())
		g.Expect(got.Spec.CABundle).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).Should(Succeed(), p.output)
	g.Expect(apiserver.WaitAvailable(ctx, env.Client, time.Minute)).To(Succeed(), p.output)
	code, _, err := get(fmt.Sprintf("https://127.0.0.1:%d/readyz", port))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(http.StatusOK))
	p.terminate(t)
}

// TestManagerWaitsForKubeAPIServer starts `machinist manager` while its
// kube-apiserver is out of reach, as after an outage that cost the leader
// its Lease: it must wait, saying so, alive to its liveness probe and not
// ready, rather than exit and be restarted in a loop; and once
// kube-apiserver is back it starts, on the same probe address.
func TestManagerWaitsForKubeAPIServer(t *testing.T) {
	g := NewWithT(t)
	raw, err := os.ReadFile(env.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	host := strings.TrimSuffix(env.Config.Host, "/")
	g.Expect(string(raw)).To(ContainSubstring(host))
	// The same credentials, through a relay that drops every connection
	// until the test lets it through to the real kube-apiserver. It holds
	// its port throughout: a port merely found free could be taken by a
	// server of another test meanwhile.
	relay := newRelay(t, strings.TrimPrefix(host, "https://"))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(os.WriteFile(kubeconfig, []byte(strings.ReplaceAll(string(raw), host, "https://"+relay.addr)), 0o600)).To(Succeed())

	health := testenv.FreePort(t)
	p := machinist(t, "manager", "--kubeconfig", kubeconfig, "--leader-elect", "--leader-election-namespace", "default",
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health))
	g.Eventually(p.output).WithTimeout(30 * time.Second).Should(ContainSubstring("waiting for kube-apiserver to serve machinist.dev/v1beta1"))
	probe := func(path string) func() (int, error) {
		return func() (int, error) {
			code, _, err := get(fmt.Sprintf("http://127.0.0.1:%d%s", health, path))
			return code, err
		}
	}
	g.Eventually(probe("/healthz")).Should(Equal(http.StatusOK), "alive while waiting")
	g.Expect(probe("/readyz")()).To(Equal(http.StatusServiceUnavailable), "not ready while waiting")
	select {
	case err := <-p.done:
		t.Fatalf("the manager exited (%v) while kube-apiserver was out of reach:\n%s", err, p.output())
	case <-time.After(3 * time.Second):
	}

	// SIGTERM while waiting is a clean stop (exit 0).
	stopped := machinist(t, "manager", "--kubeconfig", kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0")
	g.Eventually(stopped.output).WithTimeout(30 * time.Second).Should(ContainSubstring("waiting for kube-apiserver"))
	stopped.terminate(t)

	// kube-apiserver comes back.
	relay.up.Store(true)
	g.Eventually(p.output).WithTimeout(30 * time.Second).Should(ContainSubstring("kube-apiserver serves machinist.dev/v1beta1; starting"))
	g.Eventually(probe("/readyz")).WithTimeout(time.Minute).Should(Equal(http.StatusOK), p.output)
	p.terminate(t)
}

// relay is a TCP relay to target, which drops every connection until up.
type relay struct {
	addr string
	up   atomic.Bool
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	r := &relay{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = in.Close() }()
				if !r.up.Load() {
					return
				}
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer func() { _ = out.Close() }()
				go func() { _, _ = io.Copy(out, in) }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return r
}

// TestMigrateCommand runs `machinist migrate` as an operator would after
// an upgrade: on today's CRDs, each stored at its only version, it says
// for every Machinist CRD that there is nothing to do, and exits 0.
func TestMigrateCommand(t *testing.T) {
	p := machinist(t, "migrate", "--kubeconfig", env.Kubeconfig, "--timeout", "1m")
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("machinist migrate: %v\n%s", err, p.output())
		}
	case <-time.After(time.Minute):
		t.Fatalf("machinist migrate still running after a minute:\n%s", p.output())
	}
	for _, crd := range []string{"machines", "machinesets", "machinedeployments", "machineclasses", "machinehealthchecks", "machinedisruptionbudgets", "machinedrainrules", "workloadclusters"} {
		if want := crd + ".machinist.dev: stored as v1beta1 only, nothing to do"; !strings.Contains(p.output(), want) {
			t.Errorf("the output lacks %q:\n%s", want, p.output())
		}
	}
}
