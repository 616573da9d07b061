// Package clusters runs one manager over its own cluster and two workload
// clusters, each a real etcd, kube-apiserver and kube-controller-manager:
// the Machines live in the management cluster, their Nodes in the cluster
// each serves, joined with bootstrap tokens as kubelets join.
package clusters

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

// The workload clusters' names, as their WorkloadClusters are named in
// each test's namespace.
const (
	blue  = "blue"
	green = "green"
)

var (
	env   *testenv.Env
	ctrls *testenv.Controllers
	verbs *testenv.Verbs
	// workloads are the workload clusters by name; "" is the management
	// cluster itself.
	workloads = map[string]*testenv.Env{}
	// cleanups run once every test has (atEnd).
	cleanups   []func()
	cleanupsMu sync.Mutex
)

// leases are short, so that a killed machine shows within seconds.
var leases = testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second}

// parallel is how many of this package's tests run at once unless
// -parallel says: they mostly wait on clusters that start, fail and come
// back, so more of them than the cores (go test's default) share the
// machine well.
const parallel = 6

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(parallel))
	}
	// The manager's errors, to standard error: what failed, not every
	// transition.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	os.Exit(testenv.RunWithOptions(m, testenv.Options{ControllerManager: true}, func(e *testenv.Env) (func(), error) {
		env = e
		workloads[""] = e
		var (
			mu   sync.Mutex
			errs []error
			wg   sync.WaitGroup
		)
		for _, name := range []string{blue, green} {
			wg.Go(func() {
				w, err := testenv.StartWith(testenv.Options{Workload: true, ControllerManager: true})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("starting workload cluster %s: %w", name, err))
					return
				}
				workloads[name] = w
			})
		}
		wg.Wait()
		stop := func() {
			cleanupsMu.Lock()
			defer cleanupsMu.Unlock()
			for _, c := range cleanups {
				c()
			}
			if verbs != nil {
				_ = verbs.Stop()
			}
			if ctrls != nil {
				_ = ctrls.Stop()
			}
			for name, w := range workloads {
				if name != "" {
					_ = w.Stop()
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			return stop, err
		}
		var err error
		ctrls, err = e.StartControllers(manager.Options{NodeGrace: 2 * time.Second, ClusterProbePeriod: 5 * time.Second, ClusterUnreachableAfter: 5 * time.Second, ClusterJoinablePeriod: joinablePeriod, ManagementJoinable: true}, leases)
		if err != nil {
			return stop, err
		}
		verbs, err = e.StartVerbs()
		return stop, err
	}))
}

// atEnd runs fn once every test has: for what outlives a test on
// purpose, such as a provider the shared manager still holds.
func atEnd(fn func()) {
	cleanupsMu.Lock()
	defer cleanupsMu.Unlock()
	cleanups = append(cleanups, fn)
}

// startCluster starts a workload cluster of the test's own, as opts say
// beside, and stops it at the end (thawed, should the test have frozen
// it).
func startCluster(t *testing.T, opts testenv.Options) *testenv.Env {
	t.Helper()
	opts.Workload, opts.ControllerManager = true, true
	w, err := testenv.StartWith(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.ThawAPIServer()
		_ = w.Stop()
	})
	return w
}

// serve makes WorkloadClusters for blue and green in ns, from their admin
// kubeconfigs in Secrets shaped as Cluster API shapes them.
func serve(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	for _, name := range []string{blue, green} {
		kubeconfig, err := readKubeconfig(name)
		if err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig"},
			Data:       map[string][]byte{machinistv1.DefaultKubeconfigKey: kubeconfig},
		}
		if err := env.Client.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		wc := &machinistv1.WorkloadCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: secret.Name}},
		}
		if err := env.Client.Create(ctx, wc); err != nil {
			t.Fatal(err)
		}
	}
}

// ownCluster starts a workload cluster of the test's own, to stop or
// freeze without touching blue and green, and serves it in ns as the
// WorkloadCluster name. At the end it is thawed, should the test have
// frozen it, and stopped.
func ownCluster(t *testing.T, ns, name string) (*testenv.Env, *machinistv1.WorkloadCluster) {
	t.Helper()
	w := startCluster(t, testenv.Options{})
	return w, register(t, w, ns, name)
}

// register makes w a WorkloadCluster of ns named name, through a
// kubeconfig Secret.
func register(t *testing.T, w *testenv.Env, ns, name string) *machinistv1.WorkloadCluster {
	t.Helper()
	kubeconfig, err := os.ReadFile(w.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := testenv.RegisterCluster(context.Background(), env.Client, ns, name, kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return wc
}

// readKubeconfig is an admin kubeconfig of the named workload cluster.
func readKubeconfig(name string) ([]byte, error) { return os.ReadFile(workloads[name].Kubeconfig) }

// kube is an admin clientset of the named cluster.
func kube(t testing.TB, cluster string) kubernetes.Interface {
	t.Helper()
	k, err := kubernetes.NewForConfig(workloads[cluster].Config)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeOf returns the Node of providerID in the named cluster, or nil.
func nodeOf(t testing.TB, cluster, providerID string) *corev1.Node {
	t.Helper()
	nodes, err := kube(t, cluster).CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodes.Items {
		if nodes.Items[i].Spec.ProviderID == providerID {
			return &nodes.Items[i]
		}
	}
	return nil
}

// runPool creates a MachineSet of n Machines labelled pool=name whose
// Nodes join cluster, and returns them once they are Running.
func runPool(t *testing.T, ns, name, cluster string, n int) []machinistv1.Machine {
	t.Helper()
	ms := testenv.MachineSet(ns, name, int32(n))
	ms.Spec.Template.Spec.ClusterName = cluster
	if err := env.Client.Create(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
	return running(t, ns, n, 2*time.Minute, client.MatchingLabels{"pool": name})
}

// running waits until the Machines selected in ns number n, all Running
// and Ready, and returns them.
func running(t *testing.T, ns string, n int, timeout time.Duration, opts ...client.ListOption) []machinistv1.Machine {
	t.Helper()
	var ms []machinistv1.Machine
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d Machines Running in %s", n, ns), func() error {
		var err error
		if ms, err = testenv.ListMachines(context.Background(), env.Client, ns, opts...); err != nil {
			return err
		}
		ready := 0
		for i := range ms {
			if ms[i].Status.Phase == machinistv1.MachineRunning && ms[i].DeletionTimestamp.IsZero() {
				ready++
			}
		}
		if len(ms) != n || ready != n {
			return fmt.Errorf("%d Machines, %d Running", len(ms), ready)
		}
		return nil
	})
	return ms
}
