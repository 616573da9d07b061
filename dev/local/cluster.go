package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/dev/kubecontrollermanager"
	"github.com/machinist-dev/machinist/dev/kubescheduler"
	"github.com/machinist-dev/machinist/internal/freeport"
	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/internal/pki"
)

// Files and directories a cluster keeps under its directory.
const (
	// KubeconfigFile is an administrator's kubeconfig, rewritten at every
	// start (its client certificate is issued anew).
	KubeconfigFile = "kubeconfig"
	// ServingDir holds kube-apiserver's serving CA and certificate, its
	// service account signing key and its port (PortFile).
	ServingDir = "apiserver"
	// PortFile, in ServingDir, is the port kube-apiserver serves on,
	// chosen at the first start.
	PortFile = "port"
)

// clusterOptions configure startCluster.
type clusterOptions struct {
	// name says which cluster, in messages: "the management cluster".
	name string
	// dir keeps everything the cluster needs across restarts.
	dir    string
	binDir string
	scheme *runtime.Scheme
	// flags are more kube-apiserver flags.
	flags map[string]string
}

// cluster is a joinable control plane that startCluster started: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, with their
// state in a directory.
type cluster struct {
	name       string
	dir        string
	env        *envtest.Environment
	kcm        *kubecontrollermanager.Process
	sched      *kubescheduler.Process
	config     *rest.Config
	kubeconfig string // an administrator's kubeconfig file
	// starting is set once env.Start is called: from then on, whatever
	// it started must be stopped, even when it failed.
	starting bool
}

// startCluster starts, with their state under opts.dir, etcd and a
// kube-apiserver that machines join as kubelets do (bootstrap tokens, Node
// and RBAC authorization, NodeRestriction), installs the RBAC that lets a
// bootstrap token's holder join, and starts kube-controller-manager with
// the controllers that sign kubelets' certificates and those a fleet
// relies on, and kube-scheduler, which binds pods to the machines' Nodes.
// kube-apiserver keeps its address and serving certificate's CA across
// restarts (serving), so that the kubeconfigs machines were given and
// kept stay good. The caller stops it (stop), also on error.
func startCluster(ctx context.Context, opts clusterOptions) (*cluster, error) {
	env := &envtest.Environment{
		BinaryAssetsDirectory:    opts.binDir,
		Scheme:                   opts.scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(opts.dir, "etcd")}
	c := &cluster{name: opts.name, dir: opts.dir, env: env, kubeconfig: filepath.Join(opts.dir, KubeconfigFile)}
	if err := os.MkdirAll(opts.dir, 0o700); err != nil {
		return c, err
	}
	if err := serving(env.ControlPlane.GetAPIServer(), filepath.Join(opts.dir, ServingDir), opts.name); err != nil {
		return c, err
	}
	// Machines join as kubelets do, with certificates of this CA, kept
	// so that they stay valid across restarts.
	ca, err := kubecontrollermanager.NewClusterCA(filepath.Join(opts.dir, "cluster-ca"))
	if err != nil {
		return c, err
	}
	kubecontrollermanager.Joinable(env, ca)
	args := env.ControlPlane.GetAPIServer().Configure()
	for flag, value := range opts.flags {
		args.Set(flag, value)
	}
	before := orphans.Children("etcd", "kube-apiserver")
	c.starting = true
	cfg, err := env.Start()
	if err != nil {
		return c, fmt.Errorf("starting etcd and kube-apiserver of %s from %s: %w", opts.name, opts.binDir, err)
	}
	c.config = cfg
	// Killed without the chance to stop them, this process must not
	// leave a control plane running on the state directory.
	if err := orphans.Guard(started(before, orphans.Children("etcd", "kube-apiserver"))...); err != nil {
		return c, err
	}
	if err := os.WriteFile(c.kubeconfig, env.KubeConfig, 0o600); err != nil {
		return c, err
	}
	// Prepared for machines to join as `machinist cluster prepare`
	// prepares a cluster of the user's own.
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return c, err
	}
	if _, err := joinable.Install(ctx, kube, false); err != nil {
		return c, fmt.Errorf("%s: %w", opts.name, err)
	}
	// Kubernetes' own controllers, as in any cluster: those that let
	// machines join, the garbage collector, the namespace controller and
	// the node lifecycle controller. Its Node grace period is
	// nodeMonitorGrace, not Kubernetes' 50s.
	c.kcm, err = kubecontrollermanager.Start(env, kubecontrollermanager.Options{
		Binary: filepath.Join(opts.binDir, "kube-controller-manager"), Dir: opts.dir,
		CA: ca, Fleet: true, Workloads: true,
		NodeMonitorGracePeriod: nodeMonitorGrace,
	})
	if err != nil {
		return c, fmt.Errorf("%s: %w", opts.name, err)
	}
	// Pods land on the machines' Nodes as in any cluster, and their
	// agents run them as kubelets would.
	c.sched, err = kubescheduler.Start(env, kubescheduler.Options{
		Binary: filepath.Join(opts.binDir, "kube-scheduler"), Dir: opts.dir,
	})
	if err != nil {
		return c, fmt.Errorf("%s: %w", opts.name, err)
	}
	return c, nil
}

// stop stops kube-scheduler and kube-controller-manager, then
// kube-apiserver and etcd.
func (c *cluster) stop() error {
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if c.sched != nil {
		err = c.sched.Stop(stopCtx)
	}
	if c.kcm != nil {
		err = errors.Join(err, c.kcm.Stop(stopCtx))
	}
	if !c.starting {
		return err
	}
	if stopErr := c.env.Stop(); stopErr != nil {
		err = errors.Join(err, fmt.Errorf("stopping %s: %w", c.name, stopErr))
	}
	return errors.Join(err, removeEnvtestKubeconfigs(filepath.Join(c.dir, ServingDir)))
}

// removeEnvtestKubeconfigs deletes the administrator's kubeconfigs envtest
// writes into kube-apiserver's certificate directory at every start, for a
// kubectl of its own that nothing here uses: it would remove them with a
// temporary directory, but this one is kept, and they would pile up.
func removeEnvtestKubeconfigs(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.kubecfg"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// controllerManagerExited says why kube-controller-manager stopped, once
// it has.
func (c *cluster) controllerManagerExited() error {
	return c.stopped("kube-controller-manager", c.kcm.Err(), kubecontrollermanager.LogFile)
}

// schedulerExited says why kube-scheduler stopped, once it has.
func (c *cluster) schedulerExited() error {
	return c.stopped("kube-scheduler", c.sched.Err(), kubescheduler.LogFile)
}

// stopped says that what, one of the cluster's components, stopped, how
// (err), and where its log is (log, in the cluster's directory).
func (c *cluster) stopped(what string, err error, log string) error {
	return fmt.Errorf("%s of %s stopped (%v); its log is %s", what, c.name, err, filepath.Join(c.dir, log))
}

// started lists the pids of after that are not in before.
func started(before, after []int) []int {
	old := map[int]bool{}
	for _, pid := range before {
		old[pid] = true
	}
	var out []int
	for _, pid := range after {
		if !old[pid] {
			out = append(out, pid)
		}
	}
	return out
}

// serving gives apiserver an address and a serving certificate that stay
// the same across restarts, kept in dir: a machine keeps the kubeconfig it
// joined with (server and CA) for its boots to come, and envtest would
// otherwise pick a new port and a new serving CA at every start. The port
// is chosen at the first start and kept in dir/PortFile; the CA
// (serving-ca.crt) is kept and signs a new certificate at every start,
// which envtest then uses rather than make its own. envtest leaves
// SecureServing.CA empty when it finds the certificate, so it is set here:
// it is what the administrator's kubeconfig and every envtest user trust.
func serving(apiserver *envtest.APIServer, dir, name string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Those of a run that was killed before it could stop.
	if err := removeEnvtestKubeconfigs(dir); err != nil {
		return err
	}
	port, err := keptPort(filepath.Join(dir, PortFile), "the kube-apiserver of "+name, "the machines were given this address")
	if err != nil {
		return err
	}
	ca, err := pki.LoadOrNewCA(dir, "serving-ca", "machinist-apiserver-serving-ca")
	if err != nil {
		return fmt.Errorf("the serving CA of %s in %s: %w", name, dir, err)
	}
	// The service account signing key is kept too, so that service
	// account tokens stay valid across restarts.
	if err := kubecontrollermanager.Serving(apiserver, ca, dir); err != nil {
		return fmt.Errorf("serving %s from %s: %w", name, dir, err)
	}
	apiserver.SecureServing.ListenAddr = envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(port)}
	return nil
}

// keptPort is the port kept in path for what, once it is free; with no
// file yet, a free port, which it keeps there. why says, in an error, why
// a taken port is not replaced.
func keptPort(path, what, why string) (int, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		port, err := freeport.Loopback()
		if err != nil {
			return 0, err
		}
		return port, os.WriteFile(path, []byte(strconv.Itoa(port)+"\n"), 0o600)
	}
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || port <= 0 || port > 65535 {
		return 0, fmt.Errorf("%s holds no port number (%q): delete it to have a new port chosen", path, strings.TrimSpace(string(raw)))
	}
	// A control plane killed a moment ago may still hold the port while
	// its watchdog catches up.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return port, l.Close()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s serves on 127.0.0.1:%d, the port kept in %s, and that port is taken (%v): "+
				"stop what listens there (another machinist run on this state directory?) and start again; "+
				"%s, so it is kept rather than changed", what, port, path, err, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
