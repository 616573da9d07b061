package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/dev/testenv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/providers/process"
)

// leaseNamespace holds the managers' leader Lease.
const leaseNamespace = "machinist-chaos"

// class is the MachineClass of every run's process Machines.
const class = "proc"

// cluster names the WorkloadCluster, in each run's namespace, that every
// Machine of the run serves: the workload cluster's Nodes are theirs.
const cluster = "workload"

// run is one seeded run: its own namespace, its own provider state
// directory, its manager replicas, and the books kept while it runs.
type run struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	ns   string
	// dir keeps the replicas' logs; machines is the process provider's
	// state directory, shared by the replicas as on one host.
	dir, machines string
	replicas      []*replica
	monitor       *monitor
	// holdings counts what the provider holds of the run: instances and
	// running agents. The process provider's by default.
	holdings func() (instances, agents int)
	// checkProvider checks the provider's books against the live
	// Machines, and restarts says how often the instance of a Machine
	// restarted (false: unknown); the process provider's by default.
	checkProvider func() error
	restarts      func(uid types.UID, providerID string) (int, bool)
	// stops run after the teardown, last registered first.
	stops []func()
	// proxy, when the run has one, stands between the managers and
	// kube-apiserver with faults (TestAPIFaults).
	proxy *faults.Proxy
	// ops are the operations requested in this run, by Machine name.
	ops map[string][]string
	// notes are figures worth reporting (failover times and such).
	mu    sync.Mutex
	notes []string
}

func newRun(t *testing.T, seed uint64) *run {
	ctx := context.Background()
	r := &run{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15)), ops: map[string][]string{}}
	var err error
	if r.dir, err = os.MkdirTemp("", fmt.Sprintf("machinist-chaos-%d-", seed)); err != nil {
		t.Fatal(err)
	}
	r.machines = r.dir + "/machines"
	if err := ensureNamespace(ctx, env, leaseNamespace); err != nil {
		t.Fatal(err)
	}
	if r.ns, err = env.Namespace(ctx, fmt.Sprintf("chaos-%d", seed)); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: namespace %s, logs and machines in %s", seed, r.ns, r.dir)
	r.serveWorkload(ctx)
	if err := env.Client.Create(ctx, &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: class},
		Spec:       machinistv1.MachineClassSpec{Provider: process.Name},
	}); err != nil {
		t.Fatal(err)
	}
	r.monitor = startMonitor(t, r.ns)
	r.holdings = func() (int, int) {
		b := r.books()
		return len(b.dirs), len(b.agents)
	}
	r.checkProvider = r.checkBooks
	r.restarts = func(uid types.UID, _ string) (int, bool) {
		in, ok := r.books().dirs[uid]
		return in.Restarts, ok
	}
	t.Cleanup(r.finish)
	return r
}

// serveWorkload makes the run's WorkloadCluster, from the workload
// cluster's admin kubeconfig in a Secret beside it, and the run's
// namespace in the workload cluster too, for the pods that hold drains.
func (r *run) serveWorkload(ctx context.Context) {
	kubeconfig, err := os.ReadFile(workload.Kubeconfig)
	r.must(err)
	_, err = testenv.RegisterCluster(ctx, env.Client, r.ns, cluster, kubeconfig)
	r.must(err)
	r.must(ensureNamespace(ctx, workload, r.ns))
}

func ensureNamespace(ctx context.Context, e *testenv.Env, name string) error {
	err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// finish tears the run down through the manager, which must delete every
// Machine and leave no instance, then stops the replicas and kills any
// agent left over, so that the next run starts clean.
func (r *run) finish() {
	t := r.t
	if !t.Failed() {
		r.teardown()
	}
	for _, rep := range r.replicas {
		rep.stop()
	}
	for i := len(r.stops) - 1; i >= 0; i-- {
		r.stops[i]()
	}
	r.monitor.stop()
	killAgents(r.ns)
	for _, n := range r.notes {
		t.Log(n)
	}
	if t.Failed() {
		t.Logf("seed %d failed: manager logs and machines kept in %s; reproduce with CHAOS_SEED=%d CHAOS_RUNS=1", r.seed, r.dir, r.seed)
		return
	}
	if !*keepFlag {
		_ = os.RemoveAll(r.dir)
	}
}

// teardown deletes the run's sets and Machines and waits until the
// provider holds nothing of them: deletion under the same manager is part
// of the books (nothing leaked).
func (r *run) teardown() {
	t := r.t
	ctx := context.Background()
	c := env.Client
	for _, list := range []client.ObjectList{&machinistv1.MachineDeploymentList{}, &machinistv1.MachineSetList{}, &machinistv1.MachineList{}} {
		if err := c.List(ctx, list, client.InNamespace(r.ns)); err != nil {
			t.Error(err)
			return
		}
		for _, obj := range objects(list) {
			if err := client.IgnoreNotFound(c.Delete(ctx, obj)); err != nil {
				t.Error(err)
			}
		}
	}
	err := testenv.Poll(2*time.Minute, func() error {
		ms := &machinistv1.MachineList{}
		if err := c.List(ctx, ms, client.InNamespace(r.ns)); err != nil {
			return err
		}
		if len(ms.Items) > 0 {
			return fmt.Errorf("%d Machines left, e.g. %s in %s", len(ms.Items), ms.Items[0].Name, ms.Items[0].Status.Phase)
		}
		if instances, agents := r.holdings(); instances > 0 || agents > 0 {
			return fmt.Errorf("after every Machine was deleted the provider still holds %d instances and %d agents", instances, agents)
		}
		return nil
	})
	if err != nil {
		t.Errorf("teardown: %v", err)
	}
}

// managerKubeconfig is the kubeconfig file the run's managers use: the
// proxy's when the run has one.
func (r *run) managerKubeconfig() string {
	if r.proxy == nil {
		return env.Kubeconfig
	}
	path := r.dir + "/proxy.kubeconfig"
	if _, err := os.Stat(path); err == nil {
		return path
	}
	raw, err := r.proxy.Kubeconfig()
	r.must(err)
	r.must(os.WriteFile(path, raw, 0o600))
	return path
}

// note records a figure for the run's log.
func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// between returns a random duration in [lo, hi).
func (r *run) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)))
}

// objects lists the items of a list as client.Objects.
func objects(list client.ObjectList) []client.Object {
	items, _ := meta.ExtractList(list)
	out := make([]client.Object, 0, len(items))
	for _, item := range items {
		if obj, ok := item.(client.Object); ok {
			out = append(out, obj)
		}
	}
	return out
}
