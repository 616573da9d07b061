// Package quickstart runs README.md's quick start as a newcomer would:
// `machinist run` as its own process, then the README's kubectl block as
// it is written, then Ctrl-C, and checks what each step promised.
package quickstart

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinehealthcheck"
	"github.com/machinist-dev/machinist/dev/local"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// quickStartBlock is the README's shell block after the quick-start marker.
func quickStartBlock(t *testing.T) string {
	raw, err := os.ReadFile(filepath.Join(testenv.Root(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- quick-start:[^>]*-->\\s*```sh\\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal("README.md has no quick-start block after its marker")
	}
	return string(m[1])
}

// workdir is a directory laid out like the repository after `make run`
// built its binaries: bin/ with machinist, kubectl-machine and kubectl.
func workdir(t *testing.T) string {
	t.Helper()
	if err := testenv.EnsureControlPlane(); err != nil {
		t.Fatal(err)
	}
	// make run builds a real node's files too; the run finds them
	// beside the control plane's.
	if _, err := testenv.EnsureNode(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	for pkg, name := range map[string]string{"./cmd/machinist": "machinist", "./cmd/kubectl-machine": "kubectl-machine"} {
		if err := testenv.Build(pkg, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(testenv.BinDir(), "kubectl"), filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// running is a `machinist run` process.
type running struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (r *running) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// start runs `machinist run` from dir, as `make run` does, and waits until
// it says it is running.
func start(t *testing.T, dir string) *running {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "bin", "machinist"), "run", "--state-dir", ".machinist", "--bin-dir", testenv.BinDir())
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &running{cmd: cmd, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		s := bufio.NewScanner(pr)
		once := sync.Once{}
		for s.Scan() {
			r.mu.Lock()
			r.out.WriteString(s.Text() + "\n")
			r.mu.Unlock()
			if strings.HasPrefix(s.Text(), "Machinist is running.") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		r.done <- err
	}()
	t.Cleanup(func() {
		// Never leave a control plane behind, whatever failed.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	select {
	case <-ready:
	case err := <-r.done:
		t.Fatalf("machinist run exited before it was ready: %v\n%s", err, r.output())
	case <-time.After(3 * time.Minute):
		t.Fatalf("machinist run was not ready after 3 minutes:\n%s", r.output())
	}
	return r
}

// interrupt sends Ctrl-C and waits for a clean exit.
func (r *running) interrupt(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("machinist run did not exit cleanly on Ctrl-C: %v\n%s", err, r.output())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("machinist run did not stop within 2 minutes of Ctrl-C:\n%s", r.output())
	}
}

// leftovers lists processes whose command line mentions dir: the control
// plane, the agents, anything `machinist run` started there.
func leftovers(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		line := strings.ReplaceAll(string(raw), "\x00", " ")
		if strings.Contains(line, dir) {
			out = append(out, filepath.Base(filepath.Dir(p))+": "+line)
		}
	}
	return out
}

// errorLines returns the lines of a machinist run's output logged at ERROR
// (its text log format puts the level in a tab-separated column), but for
// one kind, returned apart as foreign: a request the verbs server refused
// because its client certificate was issued by none of the run's CAs (by
// key, the AKID in the line), that is by no CA either cluster trusts for
// its clients or its front proxy. Such a request comes from outside the
// run: `make test` runs many control planes on one host, and a client of
// another one may still knock on a port its own server had a moment
// before. Machinist names its CAs uniquely so that such clients offer no
// certificate at all; a CA made elsewhere (envtest's) may still share a
// name with one the run trusts.
func errorLines(out string, runCAs map[string]bool) (own, foreign []string) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "\tERROR\t") && !strings.Contains(line, "Reconciler error") {
			continue
		}
		if m := strangerCert.FindStringSubmatch(line); m != nil && !runCAs[m[1]] {
			foreign = append(foreign, line)
			continue
		}
		own = append(own, line)
	}
	return own, foreign
}

// strangerCert matches the error k8s.io/apiserver reports for a client
// certificate signed by a CA it does not trust, and captures the
// certificate's AKID.
var strangerCert = regexp.MustCompile(`Unable to authenticate the request.*AKID=([0-9A-F:]+) failed: x509: certificate signed by unknown authority`)

// runCAs returns the key IDs (as k8s.io/apiserver prints them) of every CA
// the clusters cs reach publish for client certificates and their front
// proxy: the issuers of every certificate the run itself uses.
func runCAs(g Gomega, cs ...client.Client) map[string]bool {
	ids := map[string]bool{}
	for _, c := range cs {
		cm := &corev1.ConfigMap{}
		g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "extension-apiserver-authentication"}, cm)).To(Succeed())
		for _, key := range []string{"client-ca-file", "requestheader-client-ca-file"} {
			certs, err := cert.ParseCertsPEM([]byte(cm.Data[key]))
			if key == "client-ca-file" {
				g.Expect(err).NotTo(HaveOccurred(), key)
			}
			for _, ca := range certs {
				ids[keyID(ca.SubjectKeyId)] = true
			}
		}
	}
	return ids
}

// keyID formats a key ID as k8s.io/apiserver's authentication errors do.
func keyID(id []byte) string {
	parts := make([]string, len(id))
	for i, b := range id {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// outageLines splits from out the errors of requests to the cluster at
// host that it did not answer, logged between from and to (machinist run's
// lines begin with an RFC 3339 time), and returns the rest: failed watches,
// and a probe of the WorkloadCluster's that timed out reading its answer
// (client-go logs that without naming the host).
func outageLines(out, host string, from, to time.Time) (kept string, outage []string) {
	var rest []string
	for _, line := range strings.Split(out, "\n") {
		at, err := time.Parse(time.RFC3339, strings.SplitN(line, "\t", 2)[0])
		watch := strings.Contains(line, "Failed to watch") && strings.Contains(line, host+"/")
		probe := strings.Contains(line, "Unexpected error when reading response body") &&
			strings.Contains(line, `"controller": "workloadcluster"`) && strings.Contains(line, "context deadline exceeded")
		if err == nil && (watch || probe) && !at.Before(from.Truncate(time.Second)) && !at.After(to) {
			outage = append(outage, line)
			continue
		}
		rest = append(rest, line)
	}
	return strings.Join(rest, "\n"), outage
}

// noOwnErrors fails g on any error line the run logged itself, and logs
// the foreign ones.
func noOwnErrors(t *testing.T, g Gomega, out, when string, cs ...client.Client) {
	t.Helper()
	own, foreign := errorLines(out, runCAs(g, cs...))
	for _, line := range foreign {
		t.Logf("a request from outside the run, refused: %s", line)
	}
	g.Expect(own).To(BeEmpty(), "machinist run logged errors %s", when)
}

// kubeClient is a client of the management cluster, through the
// kubeconfig machinist run wrote in dir's state directory.
func kubeClient(t *testing.T, dir string) client.Client {
	t.Helper()
	return clientFor(t, filepath.Join(dir, ".machinist", "kubeconfig"))
}

// clientFor is a client of the cluster a kubeconfig file names.
func clientFor(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := machinistv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// timedOutput is a script's output with the time each line arrived, so
// that a step's duration can be read from the lines it printed.
type timedOutput struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	lines   []timedLine
}

type timedLine struct {
	at   time.Time
	text string
}

func (o *timedOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.buf.Write(p)
	o.partial = append(o.partial, p...)
	for {
		i := bytes.IndexByte(o.partial, '\n')
		if i < 0 {
			break
		}
		o.lines = append(o.lines, timedLine{now, string(o.partial[:i])})
		o.partial = o.partial[i+1:]
	}
	return len(p), nil
}

func (o *timedOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// arrived is when the first line matching re arrived, zero if none did.
func (o *timedOutput) arrived(re *regexp.Regexp) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, l := range o.lines {
		if re.MatchString(l.text) {
			return l.at
		}
	}
	return time.Time{}
}

// machineRow is one row of the kill step's `kubectl get machine -o
// custom-columns=NAME,UID,PHASE,BOOT-ID`.
type machineRow struct{ line, name, uid, phase, boot string }

var machineRowRE = regexp.MustCompile(`(?m)^(\S+)[ \t]+([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})[ \t]+(\S+)[ \t]+(\S+)[ \t]*$`)

// inPlaceRowRE matches a row of the in-place step's tables: a worker,
// its Node and its kubelet version.
var inPlaceRowRE = regexp.MustCompile(`(?m)^(workers-\S+)\s+(workers-\S+)\s+(v\d+\.\d+\.\d+)[ \t]*$`)

func inPlaceRows(out string) [][]string { return inPlaceRowRE.FindAllStringSubmatch(out, -1) }

func machineRows(out string) []machineRow {
	var rows []machineRow
	for _, m := range machineRowRE.FindAllStringSubmatch(out, -1) {
		rows = append(rows, machineRow{line: m[0], name: m[1], uid: m[2], phase: m[3], boot: m[4]})
	}
	return rows
}

// sampleHealthCheck is config/samples/machinehealthcheck.yaml.
func sampleHealthCheck(t *testing.T) *machinistv1.MachineHealthCheck {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "samples", "machinehealthcheck.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &machinistv1.MachineHealthCheck{}
	if err := yaml.UnmarshalStrict(raw, hc); err != nil {
		t.Fatal(err)
	}
	return hc
}

// machines lists the pool's Machines in the quick start's own cluster,
// failing g: it runs inside Eventually.
func machines(g Gomega, c client.Client, pool string) []machinistv1.Machine {
	ms, err := testenv.ListMachines(context.Background(), c, "default", client.MatchingLabels{"pool": pool})
	g.Expect(err).To(Succeed())
	return ms
}

// nodeReady fails g unless the cluster holds the Node name and it is Ready.
func nodeReady(g Gomega, c client.Client, name string) {
	node := &corev1.Node{}
	g.Expect(c.Get(context.Background(), client.ObjectKey{Name: name}, node)).To(Succeed(), "Node %s", name)
	g.Expect(node.Status.Conditions).To(ContainElement(And(
		HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))), "Node %s", name)
}

// noNode fails g if the cluster holds a Node of that name.
func noNode(g Gomega, c client.Client, name string) {
	err := c.Get(context.Background(), client.ObjectKey{Name: name}, &corev1.Node{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Node %s: %v", name, err)
}

// reachable fails g unless the sample WorkloadCluster is Reachable.
func reachable(g Gomega, c client.Client) {
	wc := &machinistv1.WorkloadCluster{}
	g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: local.SampleCluster}, wc)).To(Succeed())
	g.Expect(wc.Status.Conditions).To(ContainElement(And(
		HaveField("Type", machinistv1.WorkloadClusterReachable), HaveField("Status", metav1.ConditionTrue))), "%+v", wc.Status)
}

// nodesWhereTheyBelong fails g unless every Machine in the list has a
// Ready Node in its own cluster (workload for the workers, the management
// cluster for the rest) and none in the other.
func nodesWhereTheyBelong(g Gomega, mgmt, workload client.Client, ms []machinistv1.Machine) {
	for _, m := range ms {
		g.Expect(m.Status.NodeRef).NotTo(BeNil(), m.Name)
		own, other := mgmt, workload
		if m.Spec.ClusterName == local.SampleCluster {
			own, other = workload, mgmt
		}
		nodeReady(g, own, m.Status.NodeRef.Name)
		noNode(g, other, m.Status.NodeRef.Name)
	}
}

// keptCredentials reads the node kubeconfig each Machine's machine keeps in
// the process provider's state (machines/<namespace>_<name>_<uid>/), by
// Machine name.
func keptCredentials(g Gomega, dir string, ms []machinistv1.Machine) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		raw, err := os.ReadFile(filepath.Join(dir, ".machinist", "machines", fmt.Sprintf("%s_%s_%s", m.Namespace, m.Name, m.UID), "kubeconfig"))
		g.Expect(err).To(Succeed(), "the credentials of %s", m.Name)
		out[m.Name] = string(raw)
	}
	return out
}

func TestQuickStart(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	dir := workdir(t)
	run := start(t, dir)
	g := NewWithT(t)
	// Ready is its first line; the rest of the message may be on its way.
	g.Eventually(run.output, 5*time.Second, 10*time.Millisecond).Should(ContainSubstring(`MachineDeployment "workers" of 3 Machines`))
	c := kubeClient(t, dir)

	// The first start made the sample health check, the one in
	// config/samples.
	made := &machinistv1.MachineHealthCheck{}
	g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: local.SampleHealthCheck}, made)).To(Succeed())
	sample := sampleHealthCheck(t)
	g.Expect(sample.Name).To(Equal(made.Name))
	g.Expect(equality.Semantic.DeepEqual(sample.Spec, made.Spec)).To(BeTrue(),
		"config/samples/machinehealthcheck.yaml and the health check machinist run makes differ:\n%+v\n%+v", sample.Spec, made.Spec)

	// The README's block, as written, from the top of the tree.
	sh := exec.Command("bash", "-euo", "pipefail", "-c", quickStartBlock(t))
	sh.Dir = dir
	sh.Env = append(os.Environ(), "KUBECONFIG=")
	out := &timedOutput{}
	sh.Stdout, sh.Stderr = out, out
	done := make(chan error, 1)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- sh.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the README's quick start failed: %v\n%s\n--- machinist run:\n%s", err, out.String(), run.output())
		}
	case <-time.After(10 * time.Minute):
		_ = sh.Process.Kill()
		t.Fatalf("the README's quick start did not finish in 10 minutes:\n%s", out.String())
	}
	t.Logf("quick start output:\n%s", out.String())
	g.Expect(out.String()).To(ContainSubstring("successfully rolled out"))
	// kubectl get nodes through the kubeconfig `kubectl machine kubeconfig
	// workload` printed showed the workers; through the management
	// cluster's, the spare set's.
	g.Expect(out.String()).To(MatchRegexp(`(?m)^workers-\S+\s+Ready\s`), "the workload cluster's Nodes")
	g.Expect(out.String()).To(MatchRegexp(`(?m)^spare-\S+\s+Ready\s`), "the management cluster's Nodes")
	workloadKubeconfig := filepath.Join(dir, "workload.kubeconfig")
	wl := clientFor(t, workloadKubeconfig)
	g.Eventually(func(g Gomega) { reachable(g, c) }).WithTimeout(time.Minute).Should(Succeed())
	// The disruption budget's row: MAX 1, of the three workers.
	g.Expect(out.String()).To(MatchRegexp(`(?m)^NAME\s+MAX\s+SELECTED\s+DISRUPTED\s+ALLOWED\s+NEXT-WINDOW\s+AGE\n.*\bworkers\s+1\s+`), "kubectl get mdb workers")
	budget := &machinistv1.MachineDisruptionBudget{}
	g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: local.SampleBudget}, budget)).To(Succeed())
	g.Expect(budget.Status.SelectedMachines).To(BeEquivalentTo(3))
	// The in-place step: the same Machines on the same Nodes before and
	// after, from v1.37.2 to v1.38.0.
	upgraded := inPlaceRows(out.String())
	g.Expect(upgraded).To(HaveLen(6), "the in-place step's two tables of three workers")
	for i := range 3 {
		before, after := upgraded[i], upgraded[i+3]
		g.Expect(after[1:3]).To(Equal(before[1:3]), "the same Machine and Node")
		g.Expect(before[3]).To(Equal("v1.37.2"))
		g.Expect(after[3]).To(Equal("v1.38.0"))
	}
	reboot := regexp.MustCompile(`machine/(workers-\S+) rebooted \(boot ID \S+ -> (\S+)\)`).FindStringSubmatch(out.String())
	g.Expect(reboot).NotTo(BeNil(), "the reboot step's last line")

	// The VM: its Node reports the guest's kernel, the packaged one, not
	// this host's, and the boot ID its reboot ended on.
	kernel, err := qemu.FindKernel()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.String()).To(MatchRegexp(`(?m)^vms-\S+\s+Ready\s.*Machinist guest.*\s`+regexp.QuoteMeta(kernel.Version)+`\s`), "kubectl get nodes -o wide of the VM")
	vmReboot := regexp.MustCompile(`machine/(vms-\S+) rebooted \(boot ID \S+ -> (\S+)\)`).FindStringSubmatch(out.String())
	g.Expect(vmReboot).NotTo(BeNil(), "the VM's reboot")
	g.Expect(out.String()).To(MatchRegexp(`(?m)^vms-\S+\s+`+regexp.QuoteMeta(kernel.Version)+`\s+`+regexp.QuoteMeta(vmReboot[2])+`$`), "the VM's Node on its new boot")

	// The real node: Kubernetes' kubelet with containerd, in the VM's
	// kernel, and the pod containerd ran there from the imported image.
	g.Expect(out.String()).To(MatchRegexp(`(?m)^(real-nodes-\S+)\s+Ready\s+\S+\s+\S+\s+`+regexp.QuoteMeta(local.RealNodeVersion)+
		`\s.*Machinist guest.*\s`+regexp.QuoteMeta(kernel.Version)+`\s.*containerd://2\.4\.2`), "kubectl get nodes -o wide of the real node")
	realNode := regexp.MustCompile(`(?m)^(real-nodes-\S+)\s+Ready\s`).FindStringSubmatch(out.String())
	g.Expect(realNode).NotTo(BeNil())
	g.Expect(out.String()).To(MatchRegexp(`(?m)^marker\s+1/1\s+Running\s+0\s+\S+\s+10\.88\.\S+\s+`+regexp.QuoteMeta(realNode[1])+`\s`),
		"the pod Running on the real node, at an address of its CNI bridge")
	// kubectl logs and exec, through kube-apiserver to the kubelet.
	g.Expect(out.String()).To(MatchRegexp(`(?m)^marker: started in marker$`), "kubectl logs marker")
	g.Expect(out.String()).To(MatchRegexp(`(?m)^hello from the real node$`), "kubectl exec marker")
	t.Logf("the real node: scaled to Ready in %s, the pod Ready in %s",
		out.arrived(regexp.MustCompile(`real-nodes condition met`)).Sub(out.arrived(regexp.MustCompile(`real-nodes scaled`))).Round(time.Second),
		out.arrived(regexp.MustCompile(`pod/marker condition met`)).Sub(out.arrived(regexp.MustCompile(`pod/marker created`))).Round(time.Second))

	// Kill a machine and watch it heal: the step shows the Machine before
	// the kill -9 and after it healed.
	rows := machineRows(out.String())
	g.Expect(rows).To(HaveLen(8), "the kill step's machine before and after, and the outage step's three workers before and after")
	before, after := rows[0], rows[1]
	g.Expect(after.name).To(Equal(before.name))
	g.Expect(after.uid).To(Equal(before.uid), "the same Machine, not a replacement")
	g.Expect(before.phase).To(Equal(string(machinistv1.MachineRunning)))
	g.Expect(after.phase).To(Equal(string(machinistv1.MachineRunning)))
	g.Expect(after.boot).NotTo(Equal(before.boot), "a new boot ID")
	t.Logf("kill -9 to healed: %s", out.arrived(regexp.MustCompile(regexp.QuoteMeta(after.line))).Sub(
		out.arrived(regexp.MustCompile(regexp.QuoteMeta(before.line)))).Round(time.Second))
	killed := before.name

	// The workload cluster down: the same three Machines before and after
	// (none replaced), Running; the rebooted and the repaired one on new
	// boots. A reboot asking for a drain was refused, naming the way
	// without; the one without completed on the provider's word.
	down, up := rows[2:5], rows[5:8]
	for i := range 3 {
		g.Expect(up[i].name).To(Equal(down[i].name))
		g.Expect(up[i].uid).To(Equal(down[i].uid), "the same Machine, not a replacement")
		g.Expect(up[i].phase).To(Equal(string(machinistv1.MachineRunning)))
	}
	g.Expect(up[1].boot).NotTo(Equal(down[1].boot), "the Machine rebooted while its cluster was down, on a new boot")
	g.Expect(up[2].boot).NotTo(Equal(down[2].boot), "the Machine repaired while its cluster was down, on a new boot")
	g.Expect(out.String()).To(MatchRegexp(`(?s)cannot be drained.*kubectl machine reboot \S+ --no-drain.*refused, as it should be`),
		"the reboot with a drain refused, naming the option")
	g.Expect(out.String()).To(ContainSubstring("on the provider's word"), "the reboot without drain")
	t.Logf("the workload cluster down, from its Machines listed to listed again: %s",
		out.arrived(regexp.MustCompile(regexp.QuoteMeta(up[1].line))).Sub(out.arrived(regexp.MustCompile(regexp.QuoteMeta(down[1].line)))).Round(time.Second))

	// What each step promised.
	g.Eventually(func(g Gomega) {
		spare := machines(g, c, "spare")
		g.Expect(spare).To(HaveLen(2))
		for _, m := range spare {
			g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
			g.Expect(m.Spec.ClusterName).To(BeEmpty(), "a spare Machine serves the management cluster")
		}
	}).WithTimeout(2 * time.Minute).Should(Succeed())
	// The real node scaled away: no Machine, Node or VM of it left.
	g.Eventually(func(g Gomega) {
		g.Expect(machines(g, c, local.SampleNodeSet)).To(BeEmpty())
		nodes := &corev1.NodeList{}
		g.Expect(c.List(context.Background(), nodes, client.MatchingLabels{"machinist.dev/class": local.SampleNodeClass})).To(Succeed())
		g.Expect(nodes.Items).To(BeEmpty())
		left, err := filepath.Glob(filepath.Join(dir, ".machinist", local.VMDir, "default_"+local.SampleNodeSet+"-*"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(left).To(BeEmpty(), "the real node's VM directory")
	}).WithTimeout(3 * time.Minute).Should(Succeed())
	// Each Machine's Node is in its own cluster, and only there.
	g.Eventually(func(g Gomega) {
		nodesWhereTheyBelong(g, c, wl, append(machines(g, c, "workers"), machines(g, c, "spare")...))
	}).WithTimeout(time.Minute).Should(Succeed())
	workers := machines(g, c, "workers")
	g.Expect(workers).To(HaveLen(3))
	healed := false
	for _, m := range workers {
		g.Expect(m.Spec.ClusterName).To(Equal(local.SampleCluster))
		g.Expect(m.Spec.Version).To(Equal("v1.38.0"))
		g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning))
		g.Expect(m.Status.NodeInfo.KubeletVersion).To(Equal("v1.38.0"))
		op := m.Status.Operation
		switch {
		case m.Name == killed:
			// The Reboot rung healed it: the same Machine, Running and
			// NodeHealthy with a new boot ID, the boot it was killed in
			// rebooted hard, without a drain, by the health check.
			healed = true
			g.Expect(string(m.UID)).To(Equal(before.uid))
			g.Expect(m.Status.BootID).To(Equal(after.boot))
			g.Expect(m.Status.Conditions).To(ContainElement(And(
				HaveField("Type", machinistv1.ConditionNodeHealthy), HaveField("Status", BeEquivalentTo("True")))))
			rem := m.Status.Remediation
			g.Expect(rem).NotTo(BeNil())
			g.Expect(op).NotTo(BeNil())
			g.Expect(*rem).To(And(HaveField("HealthCheck", local.SampleHealthCheck), HaveField("Phase", machinistv1.RemediationRecovered),
				HaveField("Rung", BeEquivalentTo(0)), HaveField("Action", machinistv1.RemediateReboot),
				HaveField("RecoveredAt", Not(BeNil())), HaveField("OperationID", op.ID)), "%+v", rem)
			g.Expect(*op).To(And(HaveField("Type", machinistv1.OperationReboot), HaveField("State", machinistv1.OperationSucceeded),
				HaveField("RequestedBy", machinehealthcheck.RequestedBy(local.SampleHealthCheck)), HaveField("Source", machinistv1.SourceHealthCheck),
				HaveField("BootID", before.boot)), "%+v", op)
			g.Expect(op.Options).NotTo(BeNil())
			g.Expect(op.Options.Mode).To(Equal(machinistv1.RebootHard), "the Node was unreachable")
			g.Expect(op.Options.SkipDrain).To(HaveValue(BeTrue()), "the Node was unreachable")
			t.Logf("%s: unhealthy at %s, recovered at %s", m.Name, rem.UnhealthySince.UTC().Format(time.RFC3339), rem.RecoveredAt.UTC().Format(time.RFC3339))
			if m.Name == reboot[1] {
				// The boot the health check rebooted is the one the
				// reboot step brought.
				g.Expect(op.BootID).To(Equal(reboot[2]))
			}
		default:
			// No other Machine fell unhealthy: not while rolled out, not
			// while rebooted.
			if rem := m.Status.Remediation; rem != nil {
				g.Expect(rem.Phase).To(Equal(machinistv1.RemediationHealthy), "%s: %+v", m.Name, rem)
			}
			if m.Name == reboot[1] {
				g.Expect(op).NotTo(BeNil())
				g.Expect(*op).To(And(HaveField("Type", machinistv1.OperationReboot), HaveField("State", machinistv1.OperationSucceeded)))
			}
		}
	}
	g.Expect(healed).To(BeTrue(), "the killed Machine %s is gone", killed)
	g.Eventually(func(g Gomega) {
		hc := &machinistv1.MachineHealthCheck{}
		g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: local.SampleHealthCheck}, hc)).To(Succeed())
		g.Expect(hc.Status).To(And(HaveField("ExpectedMachines", BeEquivalentTo(3)), HaveField("HealthyMachines", BeEquivalentTo(3)),
			HaveField("RemediationsInFlight", BeEquivalentTo(0))))
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// machinist run installed the admission policies: a request through
	// the annotation carries its requester's real name, whatever was
	// written (a server dry run: admitted as it would be, stored nowhere).
	g.Eventually(func(g Gomega) {
		m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: killed}}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"reboot",%q:"mallory"}}}`, machinistv1.RequestAnnotation, machinistv1.RequestedByAnnotation)
		g.Expect(c.Patch(context.Background(), m, client.RawPatch(types.MergePatchType, []byte(patch)), client.DryRunAll)).To(Succeed())
		g.Expect(m.Annotations).To(HaveKeyWithValue(machinistv1.RequestedByAnnotation, Not(Or(BeEmpty(), Equal("mallory")))))
	}).WithTimeout(30 * time.Second).Should(Succeed())

	var all machinistv1.MachineList
	g.Expect(c.List(context.Background(), &all, client.InNamespace("default"))).To(Succeed())
	g.Expect(all.Items).To(HaveLen(5), "three workers and two spare")
	names := map[string]bool{}
	for _, m := range all.Items {
		names[m.Name] = true
	}
	creds := keptCredentials(g, dir, all.Items)

	// An ordinary run, a rollout and a reboot among it, logs no error: an
	// object deleted under a reconcile, or a write that lost a race, is
	// part of normal life. The watches of the workload cluster fail while
	// the quick start holds its API frozen, and say so: those lines alone
	// are expected, from the freeze until a while after the thaw.
	wcfg, err := clientcmd.BuildConfigFromFlags("", workloadKubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	froze := out.arrived(regexp.MustCompile(`RemediationSucceeded`))
	// The rebooted worker's row after the thaw, unlike the first
	// worker's, differs from its row before.
	thawed := out.arrived(regexp.MustCompile(regexp.QuoteMeta(up[1].line))).Add(30 * time.Second)
	kept, expected := outageLines(run.output(), strings.TrimPrefix(wcfg.Host, "https://"), froze, thawed)
	t.Logf("%d errors of watches of the frozen workload cluster, as expected", len(expected))
	noOwnErrors(t, g, kept, "during the quick start", c, wl)

	// Ctrl-C leaves nothing behind, of either cluster.
	run.interrupt(t)
	g.Expect(run.output()).To(ContainSubstring("Stopping"))
	g.Eventually(func() []string { return leftovers(dir) }).WithTimeout(10 * time.Second).Should(BeEmpty())

	// A second run brings both clusters back, at the addresses and with
	// the CAs they had: every Machine is Running again with a Ready Node
	// in its own cluster, reached through the workload kubeconfig printed
	// before the restart, and its machine kept the credentials it joined
	// with rather than joining again.
	run = start(t, dir)
	g.Expect(run.output()).To(ContainSubstring("Picked up the state of the last run."))
	c = kubeClient(t, dir)
	wl = clientFor(t, workloadKubeconfig)
	g.Eventually(func(g Gomega) {
		var list machinistv1.MachineList
		g.Expect(c.List(context.Background(), &list, client.InNamespace("default"))).To(Succeed())
		got := map[string]bool{}
		for _, m := range list.Items {
			got[m.Name] = true
			g.Expect(m.Status.Phase).To(Equal(machinistv1.MachineRunning), m.Name)
			g.Expect(m.Status.Conditions).To(ContainElement(And(
				HaveField("Type", machinistv1.ConditionNodeHealthy), HaveField("Status", BeEquivalentTo("True")))), m.Name)
		}
		g.Expect(got).To(Equal(names))
		nodesWhereTheyBelong(g, c, wl, list.Items)
		reachable(g, c)
	}).WithTimeout(2*time.Minute).Should(Succeed(), fmt.Sprintf("machinist run:\n%s", run.output()))
	g.Expect(keptCredentials(g, dir, all.Items)).To(Equal(creds), "a machine's node credentials changed across the restart")

	// Kubernetes' garbage collector runs: deleting the MachineSet deletes
	// its Machines, each through its lifecycle, and their agents and Nodes.
	spare := machines(g, c, "spare")
	g.Expect(c.Delete(context.Background(), &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "spare"}})).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(machines(g, c, "spare")).To(BeEmpty()) }).WithTimeout(time.Minute).Should(Succeed())
	for _, m := range spare {
		g.Expect(leftovers(m.Status.ProviderID)).To(BeEmpty(), "the agent of %s", m.Name)
		noNode(g, c, m.Status.NodeRef.Name)
	}

	noOwnErrors(t, g, run.output(), "picking its state up", c, wl)

	// Even killed without a chance to stop anything, it leaves nothing.
	g.Expect(run.cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
	<-run.done
	g.Eventually(func() []string { return leftovers(dir) }).WithTimeout(10 * time.Second).Should(BeEmpty())
}
