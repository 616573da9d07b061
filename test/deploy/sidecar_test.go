package deploy_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/pki"
)

// TestProviderSidecar renders config/provider-sidecar, checks that the
// manager and the provider share the socket, has kube-apiserver accept it
// (server dry run), and runs both containers' commands as the Pod would,
// with the socket's directory on this host: the manager drives a Machine
// through the sidecar, and with the sidecar gone a new Machine waits with
// the reason ProviderUnavailable.
func TestProviderSidecar(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(env.Root, "config", "provider-sidecar")
	out, err := env.Kubectl(ctx, "kustomize", dir)
	g.Expect(err).NotTo(HaveOccurred(), out)
	var deployment *appsv1.Deployment
	for _, doc := range strings.Split(out, "\n---\n") {
		if strings.Contains(doc, "\nkind: Deployment\n") && strings.Contains(doc, "name: machinist-manager\n") {
			deployment = &appsv1.Deployment{}
			g.Expect(yamlToObject(doc, deployment)).To(Succeed())
		}
	}
	g.Expect(deployment).NotTo(BeNil(), "no Deployment machinist-manager in\n%s", out)
	pod := deployment.Spec.Template.Spec
	byName := map[string]corev1.Container{}
	for _, c := range pod.Containers {
		byName[c.Name] = c
	}
	g.Expect(byName).To(HaveKey("manager"))
	g.Expect(byName).To(HaveKey("provider"))
	manager, provider := byName["manager"], byName["provider"]
	const socketDir = "/run/machinist-provider"
	for _, c := range []corev1.Container{manager, provider} {
		g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "provider-socket", MountPath: socketDir}), c.Name)
	}
	g.Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "provider-socket",
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}))
	endpoint := "unix://" + socketDir + "/inmemory.sock"
	g.Expect(manager.Args).To(ContainElement("--provider=inmemory=" + endpoint))
	g.Expect(provider.Args).To(ContainElement("--endpoint=" + endpoint))

	apply := func(args ...string) {
		out, err := env.Kubectl(ctx, args...)
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
	// A server dry run of a namespaced object needs its namespace.
	err = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	g.Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	var docs []string
	for _, u := range decode(t, out) {
		if u.GetKind() == "CustomResourceDefinition" {
			// As in apply (deploy_test.go): the test control plane's
			// CRDs convert through the tests' own webhook.
			unstructured.RemoveNestedField(u.Object, "spec", "conversion")
		}
		doc, err := yaml.Marshal(u.Object)
		g.Expect(err).NotTo(HaveOccurred())
		docs = append(docs, string(doc))
	}
	rendered := filepath.Join(t.TempDir(), "rendered.yaml")
	g.Expect(os.WriteFile(rendered, []byte(strings.Join(docs, "---\n")), 0o644)).To(Succeed())
	apply("apply", "--server-side", "--dry-run=server", "-f", rendered)

	// The two commands, as the Pod runs them, with the shared directory
	// on this host.
	local := t.TempDir()
	here := func(args []string) []string {
		var out []string
		for _, a := range args {
			out = append(out, strings.ReplaceAll(a, socketDir, local))
		}
		return out
	}
	// The provider holds no cluster credentials; only the manager is
	// given the test cluster's kubeconfig, in place of a pod's own.
	sidecar := machinist(t, here(provider.Args)...)
	// The manager's own flags, without leader election and ports, which
	// other tests cover.
	var managerArgs []string
	for _, a := range append(here(manager.Args), "--kubeconfig", env.Kubeconfig) {
		if strings.HasPrefix(a, "--leader-elect") || strings.HasPrefix(a, "--leader-election") ||
			strings.HasPrefix(a, "--metrics-bind-address") || strings.HasPrefix(a, "--health-probe-bind-address") {
			continue
		}
		managerArgs = append(managerArgs, a)
	}
	g.Expect(slices.Contains(managerArgs, "--provider=inmemory=unix://"+local+"/inmemory.sock")).To(BeTrue(), "%q", managerArgs)
	mgr := machinist(t, append(managerArgs, "--metrics-bind-address=0", "--health-probe-bind-address=0")...)

	ns := env.NewNamespace(t, "sidecar", testenv.Small)
	machine := func(name string) *machinistv1.Machine {
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
		}
		g.Expect(env.Client.Create(ctx, m)).To(Succeed())
		return m
	}
	m := machine("through-the-sidecar")
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
	}).WithTimeout(time.Minute).Should(Succeed(), func() string { return mgr.output() + sidecar.output() })

	sidecar.terminate(t)
	waiting := machine("sidecar-gone")
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(waiting), waiting)).To(Succeed())
		ready := meta.FindStatusCondition(waiting.Status.Conditions, machinistv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(machinistv1.ReasonProviderUnavailable))
		g.Expect(waiting.Status.Phase).To(Equal(machinistv1.MachinePending))
	}).WithTimeout(time.Minute).Should(Succeed(), mgr.output)
	mgr.terminate(t)
}

// yamlToObject decodes one YAML document into obj.
func yamlToObject(doc string, obj runtime.Object) error {
	return yaml.Unmarshal([]byte(doc), obj)
}

// TestProviderOverTCPWithMutualTLS runs `machinist provider serve` on TCP
// with a serving certificate and client CA, as a provider running as its
// own Deployment would, and `machinist manager` reaching it with a client
// certificate: a Machine comes up through it. A manager whose certificate
// another CA signed is refused, and its Machine waits (ProviderUnavailable).
func TestProviderOverTCPWithMutualTLS(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		g.Expect(os.WriteFile(path, data, 0o600)).To(Succeed())
		return path
	}
	issue := func(ca *pki.CA, name string, req pki.Request) (cert, key string) {
		kp, err := ca.Issue(req)
		g.Expect(err).NotTo(HaveOccurred())
		return write(name+".crt", kp.CertPEM), write(name+".key", kp.KeyPEM)
	}
	ca, err := pki.NewCA("providers")
	g.Expect(err).NotTo(HaveOccurred())
	stranger, err := pki.NewCA("someone else")
	g.Expect(err).NotTo(HaveOccurred())
	caFile := write("ca.crt", ca.CertPEM())
	serverCert, serverKey := issue(ca, "provider", pki.Request{CommonName: "provider", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	clientCert, clientKey := issue(ca, "manager", pki.Request{CommonName: "manager", Client: true})
	strangerCert, strangerKey := issue(stranger, "stranger", pki.Request{CommonName: "stranger", Client: true})

	// Port 0: the provider picks its port and logs it, so that no other
	// test's server can take it between choosing and listening.
	served := machinist(t, "provider", "serve", "--provider=inmemory", "--endpoint=tcp://127.0.0.1:0",
		"--tls-cert", serverCert, "--tls-key", serverKey, "--tls-client-ca", caFile, "--log-format=json")
	address := regexp.MustCompile(`"address":"(127\.0\.0\.1:[0-9]+)"`)
	g.Eventually(func() string { return address.FindString(served.output()) }).WithTimeout(30*time.Second).ShouldNot(BeEmpty(), served.output)
	endpoint := "tcp://" + address.FindStringSubmatch(served.output())[1]

	ns := env.NewNamespace(t, "tcp", testenv.Small)
	run := func(cert, key, name string) (*process, *machinistv1.Machine) {
		p := machinist(t, "manager", "--kubeconfig", env.Kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0",
			"--provider=inmemory="+endpoint, "--provider-tls-ca", caFile, "--provider-tls-cert", cert, "--provider-tls-key", key)
		m := &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.2"},
		}
		g.Expect(env.Client.Create(ctx, m)).To(Succeed())
		return p, m
	}
	mgr, m := run(clientCert, clientKey, "over-tls")
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
	}).WithTimeout(time.Minute).Should(Succeed(), func() string { return mgr.output() + served.output() })
	mgr.terminate(t)

	refused, waiting := run(strangerCert, strangerKey, "stranger")
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(waiting), waiting)).To(Succeed())
		ready := meta.FindStatusCondition(waiting.Status.Conditions, machinistv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(machinistv1.ReasonProviderUnavailable))
	}).WithTimeout(time.Minute).Should(Succeed(), refused.output)
	refused.terminate(t)
	served.terminate(t)
}
