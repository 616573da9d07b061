// Package local runs all of Machinist on one host, for trying it out: two
// clusters, each etcd and kube-apiserver from bin/ with their state under a
// directory, kube-controller-manager (machines joining, garbage
// collection, namespaces, node lifecycle) and kube-scheduler (pods bound
// to the machines' Nodes): the management cluster, with the CRDs and
// ClusterRoles, the controllers, the verbs server registered through an
// APIService, and the process provider, whose machines are real
// processes; and a workload cluster, whose Nodes the sample workers
// become. It is what `machinist run` does.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/config"
	"github.com/machinist-dev/machinist/internal/admission"
	"github.com/machinist-dev/machinist/internal/migration"
	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/internal/pki"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// VerbsService is the Service the verbs server is registered under.
var VerbsService = types.NamespacedName{Namespace: "machinist-system", Name: "machinist-verbs"}

// Sample names: the MachineClass, MachineDeployment, MachineSet,
// MachineHealthCheck, MachineDisruptionBudget and WorkloadCluster made on
// first start, and the Secret that holds the workload cluster's
// kubeconfig, written at every start.
const (
	SampleNamespace     = "default"
	SampleClass         = "local"
	SampleDeployment    = "workers"
	SampleSet           = "spare"
	SampleHealthCheck   = "workers"
	SampleBudget        = "workers"
	SampleCluster       = "workload"
	SampleVMClass       = "vm"
	SampleVMSet         = "vms"
	SampleNodeClass     = "real-node"
	SampleNodeSet       = "real-nodes"
	SampleClusterSecret = "workload-kubeconfig"
)

// WorkloadDir, in the state directory, keeps the workload cluster as the
// state directory keeps the management cluster: etcd's data, CAs, its
// kube-apiserver's port and serving certificate, and kubeconfigs.
const WorkloadDir = "workload"

// How soon a dead machine shows on this host. Kubernetes' own values (a
// kubelet's 40s Lease, the node lifecycle controller's 50s grace period)
// are made for fleets; here a machine killed by hand must show NotReady,
// and heal, within a demo's patience.
const (
	// leaseSeconds is each agent's Lease duration, renewed every
	// renewInterval.
	leaseSeconds  = 15
	renewInterval = 3 * time.Second
	// nodeMonitorGrace is how long kube-controller-manager waits for a
	// silent kubelet before it marks the Node Ready=Unknown.
	nodeMonitorGrace = 20 * time.Second
)

// Options configure Run.
type Options struct {
	// StateDir keeps everything that must survive a restart: etcd's data,
	// certificates, the machines' state, and the kubeconfig.
	StateDir string
	// BinDir holds etcd and kube-apiserver.
	BinDir string
	// AgentBinary is the machinist binary the process provider runs as
	// each machine's agent; empty means this executable.
	AgentBinary string
	// Out receives what a person should read: where things are, what to try.
	Out io.Writer
}

// Run starts everything, creates the samples on first start, and runs
// until ctx is done; then it stops everything it started, machines too.
func Run(ctx context.Context, opts Options) (err error) {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	dir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logger := log.FromContext(ctx)
	scheme, err := newScheme()
	if err != nil {
		return err
	}

	// The management cluster, which holds Machinist's objects, then the
	// workload cluster, whose Nodes the workers become.
	crds, err := config.CRDs()
	if err != nil {
		return err
	}
	// The CRDs convert between versions through the verbs server, which
	// starts after them: its port and CA are chosen first (and kept), so
	// that the CRDs are never served without their webhook.
	verbsDir := filepath.Join(dir, "verbs")
	verbsCA, err := apiserver.CABundle(verbsDir)
	if err != nil {
		return err
	}
	verbsPort, err := keptPort(filepath.Join(verbsDir, PortFile), "the verbs server", "the CRDs' conversion webhook names this address")
	if err != nil {
		return err
	}
	conversionURL := fmt.Sprintf("https://localhost:%d%s", verbsPort, apiserver.ConversionPath)
	proxy, err := pki.FrontProxy(filepath.Join(dir, "front-proxy"))
	if err != nil {
		return err
	}
	fmt.Fprintf(opts.Out, "Starting the management cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (state in %s)...\n", dir)
	mgmt, err := startCluster(ctx, clusterOptions{
		name: "the management cluster", dir: dir, binDir: opts.BinDir, scheme: scheme,
		flags: proxy,
	})
	defer func() { err = errors.Join(err, mgmt.stop()) }()
	if err != nil {
		return err
	}
	cfg, kubeconfig := mgmt.config, mgmt.kubeconfig
	workloadDir := filepath.Join(dir, WorkloadDir)
	fmt.Fprintf(opts.Out, "Starting the workload cluster %q: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (state in %s)...\n", SampleCluster, workloadDir)
	workload, err := startCluster(ctx, clusterOptions{
		name: fmt.Sprintf("the workload cluster %q", SampleCluster), dir: workloadDir, binDir: opts.BinDir, scheme: scheme,
	})
	defer func() { err = errors.Join(err, workload.stop()) }()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	if err := apiserver.InstallCRDs(ctx, c, crds, conversionURL, verbsCA); err != nil {
		return err
	}
	if err := applyClusterRoles(ctx, c); err != nil {
		return err
	}
	// The request annotation is governed like the verbs: only those who
	// may reboot or repair can ask for it, and their name is recorded.
	if err := admission.Install(ctx, c); err != nil {
		return err
	}
	// The workload cluster's kubeconfig, where its WorkloadCluster reads
	// it: its client certificate is new at every start.
	if err := applyKubeconfigSecret(ctx, c, workload.env.KubeConfig); err != nil {
		return err
	}

	// The process provider, out of process as a provider of one's own
	// would be, then the controllers, which reach it over its socket.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	agent := opts.AgentBinary
	if agent == "" {
		agent = self
	}
	machines, err := serveProvider(self, dir, process.Name, ProviderLog,
		"--process-state-dir", filepath.Join(dir, "machines"), "--process-agent-binary", agent, "--process-exit-with-parent")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, machines.stop(time.Minute)) }()
	remote, err := plugin.Dial(process.Name, machines.endpoint, plugin.DialOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = remote.Close() }()
	if err := machines.waitReady(ctx, remote, 30*time.Second); err != nil {
		return fmt.Errorf("%w; its log is %s", err, filepath.Join(dir, ProviderLog))
	}
	// The qemu provider, likewise: its VMs run the same binary as their
	// init, and a real node's the files make node built, when it has.
	vmFlags := []string{"--qemu-state-dir", filepath.Join(dir, VMDir), "--qemu-guest-binary", agent, "--qemu-exit-with-parent"}
	nodeDir, err := realNodeDir(opts.BinDir)
	if err != nil {
		return err
	}
	if nodeDir != "" {
		vmFlags = append(vmFlags, "--qemu-node-dir", nodeDir)
	}
	vms, err := serveProvider(self, dir, qemu.Name, QEMULog, vmFlags...)
	if err != nil {
		return err
	}
	// Each VM is asked to restart in order, under TCG a few seconds.
	defer func() { err = errors.Join(err, vms.stop(2*time.Minute)) }()
	remoteVMs, err := plugin.Dial(qemu.Name, vms.endpoint, plugin.DialOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = remoteVMs.Close() }()
	if err := vms.waitReady(ctx, remoteVMs, 2*time.Minute); err != nil {
		return fmt.Errorf("%w; its log is %s", err, filepath.Join(dir, QEMULog))
	}
	goroutines, err := inmemory.New(inmemory.Options{})
	if err != nil {
		return err
	}
	defer goroutines.Stop()
	registry := providers.NewRegistry()
	if err := errors.Join(registry.Register(process.Name, remote), registry.Register(qemu.Name, remoteVMs),
		registry.Register(inmemory.Name, goroutines)); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	mgr, err := manager.New(runCtx, cfg, scheme, manager.Options{
		Actuators: registry, Registry: prometheus.NewRegistry(), QPS: 200, Burst: 400,
		// A Node condition counts against a Machine in a health check
		// only this long after the manager starts (or a watch fails):
		// until its kubelet reports, a Node may show what it was before.
		// The provider boots the agents of the last run as it starts,
		// and they report within a Lease (leaseSeconds); the default,
		// 40s, is a real kubelet's Lease and would only slow the demo.
		// nodeMonitorGrace is the node lifecycle controller's own
		// patience with a silent kubelet.
		NodeGrace: nodeMonitorGrace,
		// kubectl get managementcluster says whether machines can join
		// the management cluster, as a deployed manager's does.
		ManagementJoinable: true,
	})
	if err != nil {
		return err
	}
	mgrDone := background(runCtx, mgr.Start)
	defer func() { cancel(); err = errors.Join(err, <-mgrDone) }()

	// The verbs server.
	verbs, err := apiserver.New(apiserver.Options{
		Port:       verbsPort,
		CertDir:    verbsDir,
		Hosts:      apiserver.ServiceHosts(VerbsService),
		Kubeconfig: kubeconfig,
	})
	if err != nil {
		return err
	}
	verbsDone := background(runCtx, verbs.Run)
	defer func() { cancel(); err = errors.Join(err, <-verbsDone) }()
	if err := verbs.RegisterLocal(ctx, c, VerbsService, 2*time.Minute); err != nil {
		return err
	}
	// A state directory from a release that stored v1alpha1: its objects
	// are rewritten at v1beta1 (through the verbs server's conversion,
	// hence now), by kube-controller-manager's migrator. Nothing to do
	// once done.
	migrated, err := migration.Run(ctx, cfg, migration.Options{Log: func(format string, args ...any) {
		fmt.Fprintf(opts.Out, "Storage migration: "+format+"\n", args...)
	}})
	if err != nil {
		return fmt.Errorf("migrating stored objects to v1beta1: %w", err)
	}
	for _, r := range migrated {
		logger.V(1).Info("stored versions", "crd", r.CRD, "before", r.Before, "storage", r.Storage)
	}

	created, err := samples(ctx, c, filepath.Join(dir, samplesMarker))
	if err != nil {
		return err
	}
	logger.V(1).Info("ready", "kubeconfig", kubeconfig)
	printNext(opts.Out, kubeconfig, workload.kubeconfig, filepath.Join(dir, "machines"), created)
	select {
	case <-ctx.Done():
	case err := <-mgrDone:
		mgrDone <- err
		return fmt.Errorf("the controllers stopped: %w", err)
	case err := <-verbsDone:
		verbsDone <- err
		return fmt.Errorf("the verbs server stopped: %w", err)
	case <-machines.done:
		return fmt.Errorf("the process provider stopped; its log is %s", filepath.Join(dir, ProviderLog))
	case <-vms.done:
		return fmt.Errorf("the qemu provider stopped; its log is %s", filepath.Join(dir, QEMULog))
	case <-mgmt.kcm.Exited():
		return mgmt.controllerManagerExited()
	case <-workload.kcm.Exited():
		return workload.controllerManagerExited()
	case <-mgmt.sched.Exited():
		return mgmt.schedulerExited()
	case <-workload.sched.Exited():
		return workload.schedulerExited()
	}
	fmt.Fprintln(opts.Out, "Stopping: controllers, verbs server, machines, then both clusters' kube-scheduler, kube-controller-manager, kube-apiserver, etcd...")
	return nil
}

// background runs run(ctx) in a goroutine; the channel yields its error,
// nil when it ended because ctx was cancelled. It holds one value, so a
// reader that takes the error early puts it back for the deferred stop.
// ProviderLog is the process provider's log, in the state directory, and
// QEMULog the qemu provider's.
const (
	ProviderLog = "provider.log"
	QEMULog     = "qemu-provider.log"
)

// VMDir, in the state directory, is the qemu provider's: one directory
// per VM, with its disk and serial console log.
const VMDir = "vms"

// served is `machinist provider serve` running as a child.
type served struct {
	name     string
	cmd      *exec.Cmd
	endpoint string
	log      *os.File
	done     chan struct{}
}

// serveProvider starts the built-in provider name as `machinist provider
// serve` on a socket in dir, with flags, logging to dir/logName. Its
// machines end with it (the flags say so): this host's control plane ends
// too.
func serveProvider(self, dir, name, logName string, flags ...string) (*served, error) {
	log, err := os.OpenFile(filepath.Join(dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	endpoint := "unix://" + filepath.Join(dir, "provider", name+".sock")
	args := append([]string{"provider", "serve", "--provider", name, "--endpoint", endpoint}, flags...)
	args = append(args, "--lease-duration-seconds", strconv.Itoa(leaseSeconds), "--renew-interval", renewInterval.String(),
		"--log-level", "info")
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting the %s provider: %w", name, err)
	}
	// Killed without the chance to stop it, this process must not leave
	// the provider (and through it the machines) running.
	if err := orphans.Guard(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = log.Close()
		return nil, err
	}
	s := &served{name: name, cmd: cmd, endpoint: endpoint, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	return s, nil
}

// waitReady waits until the provider answers, so that the controllers'
// first calls find it rather than report it unavailable.
func (s *served) waitReady(ctx context.Context, c *plugin.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		probe, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := c.Probe(probe)
		cancel()
		if err == nil && resp.GetReady() {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("the %s provider exited", s.name)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s provider is not ready after %s: %v", s.name, timeout, err)
		}
	}
}

// stop sends SIGTERM, so that the provider stops its machines in order,
// and waits up to timeout before killing it.
func (s *served) stop(timeout time.Duration) error {
	defer func() { _ = s.log.Close() }()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return nil
	case <-time.After(timeout):
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("the %s provider did not stop within %s", s.name, timeout)
	}
}

func background(ctx context.Context, run func(context.Context) error) chan error {
	done := make(chan error, 1)
	go func() {
		err := run(ctx)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		done <- err
	}()
	return done
}

func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	return s, errors.Join(clientgoscheme.AddToScheme(s), machinistv1.AddToScheme(s), apiregv1.AddToScheme(s),
		apiextensionsv1.AddToScheme(s))
}

// applyClusterRoles creates or updates the generated ClusterRoles, so that
// RBAC bindings to machinist-machine-operator and machinist-viewer work.
func applyClusterRoles(ctx context.Context, c client.Client) error {
	for _, name := range []string{"role.yaml", "verbs.yaml", "operator.yaml", "viewer.yaml", "editor.yaml"} {
		raw, err := config.Manifests.ReadFile("rbac/" + name)
		if err != nil {
			return err
		}
		role := &rbacv1.ClusterRole{}
		if err := utilyaml.Unmarshal(raw, role); err != nil {
			return fmt.Errorf("rbac/%s: %w", name, err)
		}
		role.TypeMeta = metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"}
		if err := c.Patch(ctx, role, client.Apply, client.FieldOwner("machinist"), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying ClusterRole %s: %w", role.Name, err)
		}
	}
	return nil
}

// applyKubeconfigSecret creates or replaces the Secret SampleClusterSecret
// with the workload cluster's kubeconfig under the key a WorkloadCluster
// reads by default, as Cluster API keeps a cluster's kubeconfig.
func applyKubeconfigSecret(ctx context.Context, c client.Client, kubeconfig []byte) error {
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleClusterSecret},
		Data:       map[string][]byte{machinistv1.DefaultKubeconfigKey: kubeconfig},
	}
	if err := c.Patch(ctx, secret, client.Apply, client.FieldOwner("machinist"), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the workload cluster's kubeconfig to Secret %s/%s: %w", SampleNamespace, SampleClusterSecret, err)
	}
	return nil
}

// samplesMarker, in the state directory, lists the samples made, one
// "Kind/name" a line: a restart must not bring back a sample the user
// deleted, but makes those added to Machinist since the state was made.
const samplesMarker = "samples-created"

// laterSamples were added after the first ones: an empty marker, written
// before markers listed what they recorded, means every sample but these.
var laterSamples = []string{"MachineClass/" + SampleVMClass, "MachineSet/" + SampleVMSet,
	"MachineClass/" + SampleNodeClass, "MachineSet/" + SampleNodeSet}

// samples creates, once per state directory each (marker records them),
// the WorkloadCluster "workload", the MachineClass "local", the
// MachineDeployment "workers" of 3 Machines in the workload cluster, the
// MachineSet "spare" of none in the management cluster, the MachineClass
// "vm" of QEMU VMs and the MachineSet "vms" of none, the MachineClass
// "real-node" of VMs running the kubelet and the MachineSet "real-nodes"
// of none, the
// MachineHealthCheck "workers" (healthCheck) and the
// MachineDisruptionBudget "workers"; one that exists is left as it is. It
// returns the samples this start made, as "Kind/name".
func samples(ctx context.Context, c client.Client, marker string) ([]string, error) {
	made := map[string]bool{}
	if b, err := os.ReadFile(marker); err == nil {
		lines := strings.Fields(string(b))
		for _, l := range lines {
			made[l] = true
		}
		if len(lines) == 0 {
			made = nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	labels := map[string]string{"pool": SampleDeployment}
	md := &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleDeployment},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: SampleClass}, Version: "v1.37.1",
					ClusterName: SampleCluster},
			},
		},
	}
	// At most one of the workers out of service on purpose at a time:
	// the rollouts, the reboot and the health check of the quick start
	// all pass it, one Machine at a time.
	budget := &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleBudget},
		Spec: machinistv1.MachineDisruptionBudgetSpec{
			Selector:     machinistv1.LabelSelector{MatchLabels: labels},
			MaxDisrupted: intstr.FromInt32(1),
		},
	}
	workload := &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleCluster},
		Spec: machinistv1.WorkloadClusterSpec{
			Kubeconfig: machinistv1.KubeconfigReference{SecretName: SampleClusterSecret, Key: machinistv1.DefaultKubeconfigKey},
		},
	}
	all := []struct {
		key string
		obj client.Object
	}{
		{"WorkloadCluster/" + SampleCluster, workload},
		{"MachineClass/" + SampleClass, sizedClass(sampleClass(SampleClass, process.Name, ""))},
		{"MachineDeployment/" + SampleDeployment, md},
		// The spare set's Machines join the management cluster itself
		// (no clusterName): a cluster can be its own workload cluster.
		{"MachineSet/" + SampleSet, emptySet(SampleSet, SampleClass)},
		// The VMs: a real kernel each, booted under QEMU. Their Nodes
		// join the management cluster, as the spare set's do.
		{"MachineClass/" + SampleVMClass, sampleClass(SampleVMClass, qemu.Name, `{"cpus":1,"memory":"256Mi"}`)},
		{"MachineSet/" + SampleVMSet, emptySet(SampleVMSet, SampleVMClass)},
		// Real nodes: Kubernetes' own kubelet, with containerd, in a VM
		// each. Its version is the kubelet's that make node builds.
		{"MachineClass/" + SampleNodeClass, sampleClass(SampleNodeClass, qemu.Name, `{"cpus":2,"memory":"1536Mi","guest":"kubelet"}`)},
		{"MachineSet/" + SampleNodeSet, versioned(emptySet(SampleNodeSet, SampleNodeClass), RealNodeVersion)},
		{"MachineHealthCheck/" + SampleHealthCheck, healthCheck()},
		{"MachineDisruptionBudget/" + SampleBudget, budget},
	}
	var created, record []string
	for _, sample := range all {
		if made == nil && !slices.Contains(laterSamples, sample.key) || made[sample.key] {
			record = append(record, sample.key)
			continue
		}
		err := c.Create(ctx, sample.obj)
		switch {
		case err == nil:
			created = append(created, sample.key)
		case apierrors.IsAlreadyExists(err):
		default:
			return nil, fmt.Errorf("creating the sample %s: %w", sample.key, err)
		}
		record = append(record, sample.key)
	}
	return created, os.WriteFile(marker, []byte(strings.Join(record, "\n")+"\n"), 0o600)
}

// sampleClass is a sample MachineClass of provider, with spec as its
// provider spec (JSON, or "" for none), whose Nodes are labelled with its
// name.
func sampleClass(name, provider, spec string) *machinistv1.MachineClass {
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: name},
		Spec: machinistv1.MachineClassSpec{
			Provider:     provider,
			NodeTemplate: &machinistv1.NodeTemplate{NodeLabels: machinistv1.NodeLabels{"machinist.dev/class": name}},
		},
	}
	if spec != "" {
		class.Spec.ProviderSpec = runtime.RawExtension{Raw: []byte(spec)}
	}
	return class
}

// sizedClass declares what the class's Nodes offer: a process machine's
// agent reports the class's capacity as its Node's, and the
// cluster-autoscaler reads it to scale a deployment of the class up from
// zero (docs/autoscaling.md).
func sizedClass(class *machinistv1.MachineClass) *machinistv1.MachineClass {
	class.Spec.NodeTemplate.Capacity = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
	}
	return class
}

// emptySet is a sample MachineSet of no Machines of class, labelled
// pool=<name>, for `kubectl scale`.
func emptySet(name, class string) *machinistv1.MachineSet {
	labels := map[string]string{"pool": name}
	return &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: name},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(0)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, Version: "v1.37.1"},
			},
		},
	}
}

// RealNodeVersion is the version of the kubelet make node builds, which
// the real nodes' MachineSet asks for.
const RealNodeVersion = "v1.37.2"

// versioned sets the version of set's Machines.
func versioned(set *machinistv1.MachineSet, version string) *machinistv1.MachineSet {
	set.Spec.Template.Spec.Version = version
	return set
}

// realNodeDir is the directory of a real node's files under binDir, as
// make node fills it, absolute; "" when it has not been built, and a class
// of real nodes is then refused by the provider, naming make node.
func realNodeDir(binDir string) (string, error) {
	dir, err := filepath.Abs(filepath.Join(binDir, "node"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet")); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	return dir, nil
}

// healthCheck is the sample MachineHealthCheck: it watches over the
// MachineDeployment "workers" (its Machines are labelled pool=workers) with
// values for one host and a short demo. config/samples/machinehealthcheck.yaml
// is the same object; test/quickstart checks that they agree.
//
// A machine killed by hand shows Ready=Unknown nodeMonitorGrace (20s)
// after its last Lease renewal, is found unhealthy 10s later and rebooted
// (hard and without a drain, as its Node is unreachable), and is Running
// again within seconds: well under a minute in all. Ready=False is a kubelet
// that still reports but says it is not ready: given longer.
func healthCheck() *machinistv1.MachineHealthCheck {
	return &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleHealthCheck},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": SampleDeployment}},
			// A machine here is a process: Ready within seconds, not the
			// minutes a cloud instance takes.
			NodeStartupTimeout: &metav1.Duration{Duration: 3 * time.Minute},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 10 * time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 30 * time.Second}},
			},
			// 40% of the 3 Machines, rounded down, is 1: one is healed; two
			// down at once on one host point at the host, which no reboot
			// of theirs fixes.
			MaxUnhealthy: ptr.To(intstr.FromString("40%")),
			Remediation: machinistv1.Remediation{
				Ladder: []machinistv1.Rung{
					{Action: machinistv1.RemediateReboot, Mode: machinistv1.RebootSoft, Timeout: &metav1.Duration{Duration: 2 * time.Minute}},
					{Action: machinistv1.RemediateRepair, Timeout: &metav1.Duration{Duration: 3 * time.Minute}},
					{Action: machinistv1.RemediateReplace},
				},
				MaxInFlight: ptr.To(intstr.FromInt32(1)),
				Cooldown:    &metav1.Duration{Duration: 10 * time.Minute},
			},
		},
	}
}

// printNext tells a person what is running and what to try, the README's
// quick start in short.
func printNext(out io.Writer, kubeconfig, workloadKubeconfig, machines string, created []string) {
	state := "Picked up the state of the last run."
	if len(created) > 0 {
		state = fmt.Sprintf("Picked up the state of the last run, and created the samples new since, in\nnamespace %s: %s.",
			SampleNamespace, strings.Join(created, ", "))
	}
	// The first start makes the MachineDeployment, made by no later one.
	if slices.Contains(created, "MachineDeployment/"+SampleDeployment) {
		state = fmt.Sprintf("Created, in namespace %s: WorkloadCluster %q (the second cluster, reached\n"+
			"through Secret %q), MachineClass %q (provider process: every Machine is a\n"+
			"local process), MachineDeployment %q of 3 Machines, whose Nodes join the\n"+
			"workload cluster, MachineSet %q of 0, whose Nodes join this one,\n"+
			"MachineClass %q (provider qemu: every Machine a QEMU VM booting a real\n"+
			"Linux kernel) and MachineSet %q of 0 of them, whose Nodes join this one,\n"+
			"MachineClass %q (QEMU VMs running Kubernetes' kubelet and containerd) and\n"+
			"MachineSet %q of 0 of them, whose Nodes join this one too,\n"+
			"MachineHealthCheck %q, which heals the MachineDeployment's Machines, and\n"+
			"MachineDisruptionBudget %q: at most one of them out of service on purpose at once.",
			SampleNamespace, SampleCluster, SampleClusterSecret, SampleClass, SampleDeployment, SampleSet,
			SampleVMClass, SampleVMSet, SampleNodeClass, SampleNodeSet, SampleHealthCheck, SampleBudget)
	}
	fmt.Fprintf(out, `
Machinist is running. %s

Two clusters: the management cluster holds the Machines (kubeconfig
%s); the workload cluster %q holds the workers' Nodes
(kubeconfig %s, also in Secret %s/%s).

In another terminal:

  export KUBECONFIG=%s
  export PATH=$PWD/bin:$PATH             # from the repository's top: kubectl and kubectl-machine

  kubectl get machinist                  # WorkloadClusters, Machines, MachineSets, MachineDeployments, MachineClasses, ...
  kubectl get workloadcluster workload   # the workload cluster: Reachable, its version, Nodes and Machines

  # The workers' Nodes are in the workload cluster
  kubectl machine kubeconfig workload > workload.kubeconfig
  kubectl --kubeconfig workload.kubeconfig get nodes
  kubectl get mdb workers                # the disruption budget: one of the workers out of service on purpose at a time

  # Scale a MachineSet: its Machines' Nodes join the management cluster itself
  kubectl scale machineset spare --replicas=2
  kubectl get nodes

  # Roll a node upgrade through the MachineDeployment, and follow it
  kubectl patch machinedeployment workers --type=merge -p '{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}'
  kubectl machine rollout status md/workers --timeout=5m

  # Upgrade the same Machines in place: the same names and Nodes, a new version
  kubectl patch machinedeployment workers --type=merge \
    -p '{"spec":{"strategy":{"type":"InPlace","rollingUpdate":null},"template":{"spec":{"version":"v1.38.0"}}}}'
  kubectl machine rollout status md/workers --timeout=5m

  # Reboot a Machine and wait for its new boot ID
  kubectl machine reboot "$(kubectl get machines -l pool=workers -o name | head -1 | cut -d/ -f2)" --wait

  # A real machine: a QEMU VM booting a Linux kernel (under emulation, a minute or so to Ready)
  kubectl scale machineset vms --replicas=1
  kubectl wait machines -l pool=vms --for=condition=NodeHealthy --timeout=5m
  kubectl get nodes -l machinist.dev/class=vm -o wide   # KERNEL-VERSION and OS-IMAGE: the guest's own
  kubectl machine reboot "$(kubectl get machines -l pool=vms -o name | head -1 | cut -d/ -f2)" --wait

  # A real node: Kubernetes' own kubelet and containerd in a VM (make node builds them), a pod on it, its logs, an exec
  kubectl scale machineset real-nodes --replicas=1
  kubectl wait machines -l pool=real-nodes --for=condition=NodeHealthy --timeout=10m
  kubectl run marker --image=machinist.dev/marker:1 --image-pull-policy=Never \
    --overrides='{"spec":{"nodeSelector":{"machinist.dev/class":"real-node"}}}'
  kubectl wait pod/marker --for=condition=Ready --timeout=5m
  kubectl logs marker
  kubectl exec marker -- /app echo hello from the real node

  # Kill a machine and watch the MachineHealthCheck reboot it, within a minute
  kill -9 "$(grep -h '"pid"' %s/default_workers-*/state.json | head -1 | tr -dc 0-9)"
  kubectl get machines -w

More in README.md and docs/.

Ctrl-C stops everything, both clusters too; `+"`make run`"+` again picks up where it left off.
`, state, kubeconfig, SampleCluster, workloadKubeconfig, SampleNamespace, SampleClusterSecret, kubeconfig, machines)
}
