// Package local runs all of Machinist on one host, for trying it out: etcd
// and kube-apiserver from bin/ with their state under a directory,
// kube-controller-manager (garbage collection, namespaces, node
// lifecycle), the CRDs and ClusterRoles, the controllers, the verbs server registered
// through an APIService, and the process provider, whose machines are
// real processes. It is what `machinist run` does.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/machinist-dev/machinist/actuators"
	"github.com/machinist-dev/machinist/actuators/inmemory"
	"github.com/machinist-dev/machinist/actuators/process"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/config"
	"github.com/machinist-dev/machinist/internal/controllermanager"
	"github.com/machinist-dev/machinist/internal/manager"
	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/internal/pki"
)

// VerbsService is the Service the verbs server is registered under.
var VerbsService = types.NamespacedName{Namespace: "machinist-system", Name: "machinist-verbs"}

// Sample names: the MachineClass, MachineDeployment and MachineSet made on
// first start.
const (
	SampleNamespace  = "default"
	SampleClass      = "local"
	SampleDeployment = "workers"
	SampleSet        = "spare"
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

	// The control plane.
	crds, err := embeddedCRDs()
	if err != nil {
		return err
	}
	proxy, err := pki.FrontProxy(filepath.Join(dir, "front-proxy"))
	if err != nil {
		return err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    opts.BinDir,
		CRDInstallOptions:        envtest.CRDInstallOptions{CRDs: crds},
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd")}
	args := env.ControlPlane.GetAPIServer().Configure()
	for flag, value := range proxy {
		args.Set(flag, value)
	}
	fmt.Fprintf(opts.Out, "Starting etcd and kube-apiserver (state in %s)...\n", dir)
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return fmt.Errorf("starting etcd and kube-apiserver from %s: %w", opts.BinDir, err)
	}
	defer func() { err = errors.Join(err, env.Stop()) }()
	// Killed without the chance to stop them, this process must not
	// leave a control plane running on the state directory.
	if err := orphans.Guard(orphans.Children("etcd", "kube-apiserver")...); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	if err := applyClusterRoles(ctx, c); err != nil {
		return err
	}

	// Kubernetes' own controllers, as in any cluster: the garbage
	// collector, the namespace controller and the node lifecycle controller.
	// Its Node grace period is shorter than Kubernetes' 50s, like the
	// process provider's Leases, so that a machine killed by hand shows
	// NotReady within a demo's patience.
	kcm, err := controllermanager.Start(env, controllermanager.Options{
		Binary: filepath.Join(opts.BinDir, "kube-controller-manager"), Dir: dir,
		NodeMonitorGracePeriod: 20 * time.Second,
	})
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, kcm.Stop(stopCtx))
	}()

	// The process provider, then the controllers.
	agent := opts.AgentBinary
	if agent == "" {
		if agent, err = os.Executable(); err != nil {
			return err
		}
	}
	machines, err := process.New(process.Options{
		Kubeconfig:  kubeconfig,
		AgentBinary: agent,
		StateDir:    filepath.Join(dir, "machines"),
		// Shorter than the kubelet's 40s, so that a machine killed by
		// hand shows NotReady within a demo's patience.
		LeaseDurationSeconds: 15,
		RenewInterval:        3 * time.Second,
		ExitWithParent:       true,
	})
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = errors.Join(err, machines.Stop(stopCtx))
	}()
	goroutines, err := inmemory.New(inmemory.Options{Config: cfg})
	if err != nil {
		return err
	}
	defer goroutines.Stop()
	registry := actuators.NewRegistry()
	if err := errors.Join(registry.Register(process.Name, machines), registry.Register(inmemory.Name, goroutines)); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	mgr, err := manager.New(runCtx, cfg, scheme, manager.Options{
		Actuators: registry, Registry: prometheus.NewRegistry(), QPS: 200, Burst: 400,
	})
	if err != nil {
		return err
	}
	mgrDone := background(runCtx, mgr.Start)
	defer func() { cancel(); err = errors.Join(err, <-mgrDone) }()

	// The verbs server.
	verbs, err := apiserver.New(apiserver.Options{
		CertDir:    filepath.Join(dir, "verbs"),
		Hosts:      apiserver.ServiceHosts(VerbsService),
		Kubeconfig: kubeconfig,
	})
	if err != nil {
		return err
	}
	verbsDone := background(runCtx, verbs.Run)
	defer func() { cancel(); err = errors.Join(err, <-verbsDone) }()
	if err := apiserver.RegisterLocal(ctx, c, VerbsService, int32(verbs.Port), verbs.CABundle, 2*time.Minute); err != nil {
		return err
	}

	created, err := samples(ctx, c, filepath.Join(dir, samplesMarker))
	if err != nil {
		return err
	}
	logger.V(1).Info("ready", "kubeconfig", kubeconfig)
	printNext(opts.Out, kubeconfig, created)
	select {
	case <-ctx.Done():
	case err := <-mgrDone:
		mgrDone <- err
		return fmt.Errorf("the controllers stopped: %w", err)
	case err := <-verbsDone:
		verbsDone <- err
		return fmt.Errorf("the verbs server stopped: %w", err)
	case <-kcm.Exited():
		return fmt.Errorf("kube-controller-manager stopped (%v); its log is %s", kcm.Err(), filepath.Join(dir, controllermanager.LogFile))
	}
	fmt.Fprintln(opts.Out, "Stopping: controllers, verbs server, machines, kube-controller-manager, kube-apiserver, etcd...")
	return nil
}

// background runs run(ctx) in a goroutine; the channel yields its error,
// nil when it ended because ctx was cancelled. It holds one value, so a
// reader that takes the error early puts it back for the deferred stop.
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

// embeddedCRDs decodes the CRDs this binary was generated with.
func embeddedCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(config.Manifests, "crd/bases", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := config.Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := utilyaml.Unmarshal(raw, crd); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, crd)
		return nil
	})
	return out, err
}

// applyClusterRoles creates or updates the generated ClusterRoles, so that
// RBAC bindings to machinist-machine-operator and machinist-viewer work.
func applyClusterRoles(ctx context.Context, c client.Client) error {
	for _, name := range []string{"role.yaml", "verbs.yaml", "operator.yaml", "viewer.yaml"} {
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

// samplesMarker, in the state directory, says the samples were made once:
// a restart must not bring back a sample the user deleted.
const samplesMarker = "samples-created"

// samples creates the MachineClass "local", the MachineDeployment
// "workers" of 3 Machines and the MachineSet "spare" of none on the first
// start only (marker records it); one that exists is left as it is. It
// reports whether this start created them.
func samples(ctx context.Context, c client.Client, marker string) (bool, error) {
	if _, err := os.Stat(marker); err == nil {
		return false, nil
	}
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleClass},
		Spec: machinistv1.MachineClassSpec{
			Provider:     process.Name,
			NodeTemplate: &machinistv1.NodeTemplate{Labels: map[string]string{"machinist.dev/class": SampleClass}},
		},
	}
	labels := map[string]string{"pool": SampleDeployment}
	md := &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleDeployment},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: SampleClass}, Version: "v1.37.1"},
			},
		},
	}
	spare := map[string]string{"pool": SampleSet}
	set := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SampleSet},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(0)),
			Selector: machinistv1.LabelSelector{MatchLabels: spare},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: spare},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: SampleClass}, Version: "v1.37.1"},
			},
		},
	}
	created := false
	for _, obj := range []client.Object{class, md, set} {
		err := c.Create(ctx, obj)
		switch {
		case err == nil:
			created = true
		case apierrors.IsAlreadyExists(err):
		default:
			return false, fmt.Errorf("creating the sample %s: %w", obj.GetName(), err)
		}
	}
	return created, os.WriteFile(marker, nil, 0o600)
}

func printNext(out io.Writer, kubeconfig string, created bool) {
	state := "Picked up the state of the last run."
	if created {
		state = fmt.Sprintf("Created, in namespace %s: MachineClass %q (provider process: every Machine is a\nlocal process), MachineDeployment %q of 3 Machines and MachineSet %q of 0.",
			SampleNamespace, SampleClass, SampleDeployment, SampleSet)
	}
	fmt.Fprintf(out, `
Machinist is running. %s

In another terminal:

  export KUBECONFIG=%s
  export PATH=$PWD/bin:$PATH             # from the repository's top: kubectl and kubectl-machine

  kubectl get machinist                  # Machines, MachineSets, MachineDeployments, MachineClasses
  kubectl get nodes

  # Scale a MachineSet
  kubectl scale machineset spare --replicas=2

  # Roll a node upgrade through the MachineDeployment, and follow it
  kubectl patch machinedeployment workers --type=merge -p '{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}'
  kubectl machine rollout status md/workers --timeout=5m

  # Reboot a Machine and wait for its new boot ID
  kubectl machine reboot "$(kubectl get machines -l pool=workers -o name | head -1 | cut -d/ -f2)" --wait

More in README.md and docs/.

Ctrl-C stops everything; `+"`make run`"+` again picks up where it left off.
`, state, kubeconfig)
}
