// Package testenv starts a real etcd and kube-apiserver, built from the
// pinned sources in hack/controlplane, with Machinist's CRDs installed. Every
// controller and end-to-end test runs against it; none uses a fake client.
//
// Every control plane it starts can be joined as a kubelet joins: with
// a bootstrap token (Env.Join) a machine gets its own client certificate,
// which kube-controller-manager approves and signs, and is then confined to
// its Node by the Node authorizer and NodeRestriction.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/machinist-dev/machinist/api/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/config"
	"github.com/machinist-dev/machinist/dev/kubecontrollermanager"
	"github.com/machinist-dev/machinist/dev/kubescheduler"
	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/internal/pki"
)

// Env is a running control plane.
type Env struct {
	// Root is the repository's top directory.
	Root string
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client with Machinist's types registered.
	Client client.Client
	// Scheme knows the core Kubernetes kinds and Machinist's, at both versions.
	Scheme *k8sruntime.Scheme
	// Kubeconfig is the path of an administrator's kubeconfig for kubectl.
	Kubeconfig string

	env *envtest.Environment
	dir string
	ca  *kubecontrollermanager.ClusterCA
	kcm *kubecontrollermanager.Process
	// sched is nil unless Options.Scheduler.
	sched *kubescheduler.Process
	// apiserverArgs is the command line of envtest's kube-apiserver, once
	// StopAPIServer has killed it; apiserver is the one StartAPIServer
	// started in its place (nil while none runs).
	apiserverArgs []string
	apiserver     *process
	// etcd is the etcd RestoreEtcd started in envtest's place.
	etcd *process
	// conversion serves the CRDs' conversion webhook (none in a
	// workload cluster, which has no CRDs).
	conversion *conversion
}

// Options choose what runs beside etcd and kube-apiserver.
type Options struct {
	// ControllerManager starts Kubernetes' kube-controller-manager with the
	// garbage collector, the namespace controller and the node lifecycle
	// controller, for tests of what those do. Tests that need none of it
	// start faster without.
	ControllerManager bool
	// Scheduler starts Kubernetes' kube-scheduler, so that pods are
	// scheduled as in a cluster: bound to a Node that fits them, whose
	// machine's agent then runs them. Without it, a pod without a
	// nodeName stays Pending. kube-controller-manager then runs the node
	// lifecycle controller too, even without ControllerManager: it lifts
	// the not-ready taint kube-apiserver gives every new Node once the
	// Node is Ready, and until then no pod is scheduled there.
	Scheduler bool
	// Workloads runs kube-controller-manager's controllers of pods
	// (kubecontrollermanager.WorkloadControllers), for tests of real
	// nodes that run Deployments behind PodDisruptionBudgets; set it
	// with ControllerManager, whose garbage collector deletes what they
	// own.
	Workloads bool
	// NodeMonitorGracePeriod is how long a silent kubelet's Node stays
	// Ready before the node lifecycle controller marks it Unknown; zero
	// means 5s, against Kubernetes' 50s, so that tests need not wait;
	// with Scheduler alone, zero keeps Kubernetes' 50s, so that the Nodes
	// of agents that renew their Leases every 10s (the default) do not
	// turn Unknown, and unschedulable, between renewals.
	NodeMonitorGracePeriod time.Duration
	// Workload starts a workload cluster: one whose Nodes Machines join
	// but that holds no Machinist objects, so no CRDs are installed and
	// no front proxy is set up for the verbs server. Tests run several
	// beside a management cluster, so it starts no more than joining needs.
	Workload bool
	// Unprepared leaves out what a cluster made by another tool lacks for
	// machines to join it: the join RBAC (package joinable's Install),
	// and what Lacks names besides. Tests of what joining needs use it.
	Unprepared bool
	// Lacks are what else the cluster lacks, even prepared.
	Lacks Lacks
	// CRDs, when set, are installed as they are instead of config/crd/bases:
	// an earlier release's, for a test of an upgrade from it. A CRD among
	// them that serves several versions converts through the tests' webhook.
	CRDs []*apiextensionsv1.CustomResourceDefinition
}

// ManagerNamespace is the manager's own namespace in a management
// cluster the tests start, as config/default deploys it.
const ManagerNamespace = "machinist-system"

// Root returns the repository's top directory, found from this file's path
// so that tests in any package agree on it.
func Root() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("testenv: cannot locate the source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir is where the control-plane binaries live: $MACHINIST_BIN or bin/.
func BinDir() string {
	if dir := os.Getenv("MACHINIST_BIN"); dir != "" {
		return dir
	}
	return filepath.Join(Root(), "bin")
}

// EnsureControlPlane builds etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kubectl into BinDir unless the pinned versions are
// already there. It is safe to call from several test processes at once:
// the build script holds a lock.
func EnsureControlPlane() error {
	cmd := exec.Command("bash", filepath.Join(Root(), "hack", "controlplane", "build.sh"))
	cmd.Env = append(os.Environ(), "MACHINIST_BIN="+BinDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the control plane (hack/controlplane/build.sh): %w\n%s", err, out.String())
	}
	return nil
}

// EnsureNode builds what a real node's guest holds (the kubelet,
// containerd, runc, the CNI plugins and the images; hack/node/build.sh)
// into BinDir()/node unless the pinned versions are there, and returns
// that directory. Safe to call from several test processes at once.
func EnsureNode() (string, error) {
	cmd := exec.Command("bash", filepath.Join(Root(), "hack", "node", "build.sh"))
	cmd.Env = append(os.Environ(), "MACHINIST_BIN="+BinDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building a real node's files (hack/node/build.sh): %w\n%s", err, out.String())
	}
	return filepath.Join(BinDir(), "node"), nil
}

// Start builds the control plane if needed, starts it, installs the CRDs
// from config/crd/bases and waits until they are served.
func Start() (*Env, error) { return StartWith(Options{}) }

// Lacks are what a cluster may lack of what machines joining it need.
type Lacks struct {
	// BootstrapTokens: kube-apiserver runs without
	// --enable-bootstrap-token-auth.
	BootstrapTokens bool
	// NodeAuthorizer: kube-apiserver authorizes with RBAC alone.
	NodeAuthorizer bool
	// NodeRestriction: kube-apiserver runs without that admission plugin
	// (it has no other enabled beyond its defaults then).
	NodeRestriction bool
	// Approver: kube-controller-manager runs without its certificate
	// approver.
	Approver bool
	// TokenCleaner: kube-controller-manager runs without its token
	// cleaner.
	TokenCleaner bool
}

// lack takes from kube-apiserver's args what l says it lacks.
func lack(args *envtest.Arguments, l Lacks) {
	if l.BootstrapTokens {
		args.Set("enable-bootstrap-token-auth", "false")
	}
	if l.NodeAuthorizer {
		args.Set("authorization-mode", "RBAC")
	}
	if l.NodeRestriction {
		args.Disable("enable-admission-plugins")
	}
}

// StartWorkload starts a workload cluster (Options.Workload).
func StartWorkload() (*Env, error) { return StartWith(Options{Workload: true}) }

// StartWith is Start with more beside the control plane. Every control
// plane runs kube-controller-manager for joining (its CSR controllers and
// token cleaner) and has the bootstrap RBAC installed.
func StartWith(opts Options) (*Env, error) {
	if err := EnsureControlPlane(); err != nil {
		return nil, err
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := machinistv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := apiregv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "machinist-testenv-")
	if err != nil {
		return nil, err
	}
	ca, err := kubecontrollermanager.NewClusterCA(filepath.Join(dir, "cluster-ca"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	root := Root()
	env := &envtest.Environment{
		BinaryAssetsDirectory:    BinDir(),
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	kubecontrollermanager.Joinable(env, ca)
	// Served with a CA of this process's, which also signs
	// kube-apiserver's client certificate to kubelets: a real node's
	// kubelet trusts its join data's CA for it.
	servingDir := filepath.Join(dir, "serving")
	servingCA, err := pki.LoadOrNewCA(servingDir, "serving-ca", "machinist-testenv-serving-ca")
	if err == nil {
		err = kubecontrollermanager.Serving(env.ControlPlane.GetAPIServer(), servingCA, servingDir)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	lack(env.ControlPlane.GetAPIServer().Configure(), opts.Lacks)
	var conv *conversion
	var crds []*apiextensionsv1.CustomResourceDefinition
	if !opts.Workload {
		// The CRDs as generated, converting through a webhook served
		// from this process, which starts before they are installed.
		if crds, err = config.CRDs(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		if opts.CRDs != nil {
			crds = make([]*apiextensionsv1.CustomResourceDefinition, len(opts.CRDs))
			for i, crd := range opts.CRDs {
				crds[i] = crd.DeepCopy()
			}
		}
		if conv, err = startConversion(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		// The aggregator's front proxy, so that the verbs server can be
		// reached through kube-apiserver (StartVerbs).
		proxy, err := pki.FrontProxy(filepath.Join(dir, "front-proxy"))
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		args := env.ControlPlane.GetAPIServer().Configure()
		for flag, value := range proxy {
			args.Set(flag, value)
		}
	}
	cfg, err := env.Start()
	if err != nil {
		// Start can fail after the processes are up (installing CRDs);
		// never leave them running.
		_ = env.Stop()
		if conv != nil {
			_ = conv.stop()
		}
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting etcd and kube-apiserver from %s: %w", BinDir(), err)
	}
	// A test binary stopped by -timeout never runs Stop.
	if err := orphans.Guard(orphans.Children("etcd", "kube-apiserver")...); err != nil {
		_ = env.Stop()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e := &Env{Root: root, Config: cfg, Scheme: scheme, env: env, dir: dir, ca: ca, conversion: conv}
	envStarted() // Stop, from here on, counts it out
	fail := func(err error) (*Env, error) {
		_ = e.Stop()
		return nil, err
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return fail(err)
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, env.KubeConfig, 0o600); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !opts.Unprepared {
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fail(err)
		}
		if _, err := joinable.Install(ctx, kube, false); err != nil {
			return fail(err)
		}
	}
	if conv != nil {
		if err := apiserver.InstallCRDs(ctx, e.Client, crds, conv.url, conv.caBundle); err != nil {
			return fail(err)
		}
		// The manager's own namespace, as config/default makes it: where
		// it keeps the tokens of machines repaired while their cluster
		// is down.
		if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); err != nil {
			return fail(err)
		}
	}
	if err := e.startControllerManager(opts); err != nil {
		return fail(err)
	}
	if opts.Scheduler {
		if err := e.startScheduler(); err != nil {
			return fail(err)
		}
	}
	return e, nil
}

// startControllerManager runs kube-controller-manager, with the fleet's
// controllers only if opts ask for them, and the node lifecycle
// controller alone of them for a scheduler; its log is a file in the
// environment's directory.
func (e *Env) startControllerManager(opts Options) error {
	grace := opts.NodeMonitorGracePeriod
	if grace == 0 && opts.ControllerManager {
		grace = 5 * time.Second
	}
	var without []string
	if opts.Lacks.Approver {
		without = append(without, kubecontrollermanager.ApproverController)
	}
	if opts.Lacks.TokenCleaner {
		without = append(without, kubecontrollermanager.TokenCleanerController)
	}
	var err error
	e.kcm, err = kubecontrollermanager.Start(e.env, kubecontrollermanager.Options{
		Binary: filepath.Join(BinDir(), "kube-controller-manager"), Dir: e.dir,
		CA: e.ca, Fleet: opts.ControllerManager, NodeLifecycle: opts.Scheduler, Workloads: opts.Workloads,
		NodeMonitorGracePeriod: grace, NodeMonitorPeriod: time.Second,
		Without: without,
	})
	return err
}

// startScheduler runs kube-scheduler; its log is a file in the
// environment's directory.
func (e *Env) startScheduler() error {
	var err error
	e.sched, err = kubescheduler.Start(e.env, kubescheduler.Options{
		Binary: filepath.Join(BinDir(), "kube-scheduler"), Dir: e.dir,
	})
	return err
}

// Stop stops the control plane and removes its files.
func (e *Env) Stop() error {
	defer envStopped()
	var err error
	if e.sched != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = e.sched.Stop(ctx)
		cancel()
	}
	if e.kcm != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = errors.Join(err, e.kcm.Stop(ctx))
		cancel()
	}
	if e.apiserver != nil {
		err = errors.Join(err, e.StopAPIServer())
	}
	if e.etcd != nil {
		e.etcd.kill()
	}
	err = errors.Join(err, e.env.Stop())
	if e.conversion != nil {
		err = errors.Join(err, e.conversion.stop())
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}

// Kubectl runs the real kubectl from BinDir against this control plane and
// returns its standard output; an error carries standard error.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := e.KubectlCommand(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %v: %w: %s", args, err, stderr.String())
	}
	return stdout.String(), nil
}

// KubectlCommand is the real kubectl from BinDir with args, run from the
// repository's top, its KUBECONFIG this control plane's (flags given
// before a plugin's name are refused, so the kubeconfig is not one), for a
// test that needs more than Kubectl: standard input, standard error, a
// plugin on PATH.
func (e *Env) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(BinDir(), "kubectl"), args...)
	cmd.Dir = e.Root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig)
	return cmd
}

// Run is a TestMain body: it starts a control plane, hands it to ready,
// runs the package's tests, stops the control plane and returns the exit
// code for os.Exit.
func Run(m *testing.M, ready func(*Env)) int {
	return RunWith(m, func(e *Env) (func(), error) {
		ready(e)
		return func() {}, nil
	})
}

// RunWith is Run for a package that starts more beside the control plane:
// setup starts it and returns how to stop it, which runs before the
// control plane stops, also when setup fails.
func RunWith(m *testing.M, setup func(*Env) (stop func(), err error)) int {
	return RunWithOptions(m, Options{}, setup)
}

// RunWithOptions is RunWith with more beside the control plane.
func RunWithOptions(m *testing.M, opts Options, setup func(*Env) (stop func(), err error)) int {
	if fuzzingOnly() {
		return m.Run()
	}
	e, err := StartWith(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	stop, err := setup(e)
	if stop != nil {
		defer stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// fuzzingOnly reports whether this test binary runs a fuzz target's
// inputs and no test: as a fuzzing worker, or as the process that
// coordinates the workers when asked to run no test (go test -run '^$'
// -fuzz ..., as make fuzz runs it). Neither needs a control plane, and
// one started by every worker would crowd the host. A fuzz target never
// uses the Env.
func fuzzingOnly() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	value := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return value("test.fuzzworker") == "true" || (value("test.fuzz") != "" && value("test.run") == "^$")
}

// Namespace creates a namespace with a generated name for one test. Only
// an Env with the ControllerManager option runs the namespace controller;
// without it, a deleted namespace stays Terminating and refuses the Events
// written into it, so tests of such an Env leave their namespaces be.
func (e *Env) Namespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		return "", err
	}
	return ns.Name, nil
}

// Build compiles the repository's package pkg (such as "./cmd/machinist")
// into the file out, for tests that run Machinist's binaries as processes.
func Build(pkg, out string) error { return BuildIn(Root(), pkg, out) }

// BuildIn is Build of the module whose top directory is root: Machinist's
// source of another commit, for a test of an upgrade from it.
func BuildIn(root, pkg, out string) error {
	cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = root
	// As the Makefile builds everything: see its notes on CGO_ENABLED and
	// GO_LDFLAGS.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, output)
	}
	return nil
}

// StopAPIServer kills kube-apiserver (SIGKILL, as a crash or the loss of
// its host would), leaving etcd and everything else running; clients see
// connections refused until StartAPIServer. Nothing is lost: etcd holds
// the state. Tests of what Machinist does meanwhile use it. (A SIGTERM
// would do as well, but kube-apiserver drains its watches for up to a
// minute first.)
func (e *Env) StopAPIServer() error {
	if e.apiserver != nil {
		// One StartAPIServer started.
		e.apiserver.kill()
		e.apiserver = nil
		return nil
	}
	if e.apiserverArgs != nil {
		return errors.New("testenv: kube-apiserver is not running")
	}
	// envtest's: its command line is what StartAPIServer runs again.
	args, err := killOwn("kube-apiserver", e.apiserverFlag())
	if err != nil {
		return err
	}
	e.apiserverArgs = args
	return nil
}

// apiserverFlag is on the command line of this control plane's
// kube-apiserver alone: its own cert-dir.
func (e *Env) apiserverFlag() string {
	return "--cert-dir=" + e.env.ControlPlane.GetAPIServer().CertDir
}

// FreezeAPIServer stops kube-apiserver with SIGSTOP: it keeps its port and
// its connections, which now hang instead of failing, as a host that has
// stopped answering does. ThawAPIServer resumes it.
func (e *Env) FreezeAPIServer() error { return e.signalAPIServer(syscall.SIGSTOP) }

// ThawAPIServer resumes a kube-apiserver FreezeAPIServer stopped.
func (e *Env) ThawAPIServer() error { return e.signalAPIServer(syscall.SIGCONT) }

func (e *Env) signalAPIServer(sig syscall.Signal) error {
	pid := 0
	if e.apiserver != nil {
		pid = e.apiserver.cmd.Process.Pid
	} else {
		pids := ownChildren("kube-apiserver", e.apiserverFlag())
		if len(pids) != 1 {
			return fmt.Errorf("testenv: found %d kube-apiserver processes of this control plane, want 1", len(pids))
		}
		pid = pids[0]
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("testenv: %s to kube-apiserver %d: %w", sig, pid, err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same flags, certificates and port, over the same etcd, and waits until it
// is ready.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if e.apiserverArgs == nil || e.apiserver != nil {
		return errors.New("testenv: StartAPIServer without StopAPIServer")
	}
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	e.apiserver, err = e.startAgain(ctx, "kube-apiserver", e.apiserverArgs, func(ctx context.Context) error {
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) != "ok" {
			err = errNotReady
		}
		return err
	})
	return err
}
