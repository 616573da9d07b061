// Package manager assembles Machinist's controllers into one
// controller-runtime manager, so that tests, benchmarks and the machinist
// binary all run the same wiring.
package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/controllers/machinedisruptionbudget"
	"github.com/machinist-dev/machinist/controllers/machinehealthcheck"
	"github.com/machinist-dev/machinist/controllers/machineset"
	"github.com/machinist-dev/machinist/controllers/managementcluster"
	"github.com/machinist-dev/machinist/controllers/workloadcluster"
	"github.com/machinist-dev/machinist/manager/gauges"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// Options configure the controllers.
type Options struct {
	// Actuators are the providers Machines can use.
	Actuators *providers.Registry
	// MachineWorkers and MachineSetWorkers are the concurrent reconciles of
	// the Machine controller and of each set controller (MachineSet and
	// MachineDeployment); zero means 16 and 4.
	MachineWorkers, MachineSetWorkers int
	// PerMachine paces the reconciles of MachineSets and
	// MachineDeployments that their Machines' changes ask for; zero means
	// the sets' default (see package pace).
	PerMachine time.Duration
	// ProvisionTimeout, Backoff and DrainPoll tune the Machine controller;
	// zero values take its defaults.
	ProvisionTimeout time.Duration
	Backoff          machine.Backoff
	DrainPoll        time.Duration
	// OperationTimeout bounds how long a reboot or repair may take; see
	// machine.Reconciler.
	OperationTimeout time.Duration
	// QPS and Burst bound the manager's requests to the API server; zero
	// keeps the rest.Config's own (client-go's default is 5 and 10, far too
	// few for thousands of Machines).
	QPS   float32
	Burst int
	// Repeatable lets one process build several managers one after another
	// (benchmarks do); controller-runtime otherwise refuses a controller
	// name it has seen before.
	Repeatable bool
	// MetricsAddr serves /metrics; "0" or empty serves nothing.
	MetricsAddr string
	// MetricsSecure serves /metrics over HTTPS and answers only a bearer
	// token that kube-apiserver authenticates (TokenReview) and allows get
	// on the non-resource URL /metrics (SubjectAccessReview); the
	// manager's own credentials must allow it to create both reviews.
	MetricsSecure bool
	// MetricsCertDir holds the tls.crt and tls.key MetricsSecure serves
	// with, reloaded when they change; empty means a self-signed
	// certificate made at start.
	MetricsCertDir string
	// Registry receives the lifecycle metrics; nil means controller-runtime's
	// registry, which MetricsAddr serves.
	Registry prometheus.Registerer
	// PprofAddr serves Go's /debug/pprof profiles; "0" or empty serves
	// nothing.
	PprofAddr string
	// HealthAddr serves /healthz and /readyz; "0" or empty serves nothing.
	HealthAddr string
	// LeaderElection makes only one of several managers act at a time;
	// the Lease "machinist-manager" lives in LeaderElectionNamespace
	// (empty: the namespace the process runs in, in a cluster).
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod time the election; zero
	// values keep client-go's 15s, 10s and 2s. A leader that cannot renew
	// within RenewDeadline exits; a candidate takes an expired Lease
	// LeaseDuration after its last renewal, checking every RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// NodeGrace is how long kubelets are given to report after the manager
	// starts or the API server comes back before a Node condition counts
	// against a Machine in a health check; zero means 40s, a kubelet's
	// Lease duration.
	NodeGrace time.Duration
	// DriftDelay is how long after a template changes its Machines'
	// Drifted conditions are brought up to date; zero means
	// machine.DefaultDriftDelay.
	DriftDelay time.Duration
	// JoinServer and JoinCAData are how new machines of the manager's own
	// cluster reach its API server, when not as the manager does: a
	// manager in the cluster talks to the kubernetes Service, which
	// machines outside it cannot reach, and one behind a proxy talks to
	// the proxy. Empty means the manager's own address and CA. (Machines
	// of a WorkloadCluster use the server and CA of its kubeconfig.)
	JoinServer string
	JoinCAData []byte
	// ClusterQPS and ClusterBurst bound the requests to each workload
	// cluster, apart from QPS and Burst; zero takes the clusters
	// package's defaults.
	ClusterQPS   float32
	ClusterBurst int
	// ClusterProbePeriod is how often each workload cluster is probed;
	// zero takes workloadcluster.DefaultProbePeriod.
	ClusterProbePeriod time.Duration
	// ClusterUnreachableAfter is how long a workload cluster that answered
	// must fail its probes before it is called unreachable; zero takes
	// workloadcluster.DefaultUnreachableAfter.
	ClusterUnreachableAfter time.Duration
	// InventoryPeriod is how often every provider that can list its
	// instances is compared with the Machines, for orphans and ghosts;
	// zero takes inventory.DefaultPeriod, negative turns it off.
	InventoryPeriod time.Duration
	// OrphanDeletionGrace is how long an orphan instance (made for a
	// Machine that is gone, claimed by none) is reported before it is
	// deleted; zero never deletes one.
	OrphanDeletionGrace time.Duration
	// GhostReplacementLimit is the percentage of a MachineSet's (and a
	// provider's) Machines that may be ghosts, their instances gone, for
	// the inventory to delete them so that their sets replace them; zero
	// takes inventory.DefaultGhostLimit, negative replaces none.
	GhostReplacementLimit int
	// ClusterJoinablePeriod is how often each connected workload
	// cluster's join checks run again, for its Joinable condition; zero
	// takes joinprobe.DefaultPeriod.
	ClusterJoinablePeriod time.Duration
	// ManagementJoinable makes and keeps the ManagementCluster, whose
	// Joinable condition says, from the same checks and on the same
	// period, whether machines can join this cluster; its Machines wait
	// with that reason when not. The checks make a bootstrap token and a
	// certificate request here. A cluster without the ManagementCluster's
	// CRD (an upgrade whose CRDs are not applied yet) goes without, and
	// the manager says so.
	ManagementJoinable bool
	// Namespace is the manager's own namespace, where it keeps what no
	// tenant may read or write (the bootstrap tokens of machines repaired
	// while their cluster could not be reached); empty means
	// machine.DefaultNamespace. It must exist.
	Namespace string
	// KubeconfigTrust is what a WorkloadCluster's kubeconfig may ask of
	// the manager beyond inline data: by default nothing (no exec plugin,
	// no file, no unverified server). Relaxing it trusts everyone who may
	// write a WorkloadCluster's Secret with the manager's process.
	KubeconfigTrust clusters.Trust
	// Now is the calendar: the clock the disruption budgets' windows
	// open and close on, for every controller that asks them and for the
	// budgets' own status. time.Now when nil. Tests move it to open a
	// window; each controller's timeouts keep the real clock.
	Now func() time.Time
}

// Manager is a controller-runtime manager with Machinist's controllers.
type Manager struct {
	ctrl.Manager
	// Metrics are the lifecycle metrics the Machine controller updates.
	Metrics *machine.Metrics
	// Rollouts counts MachineDeployment rollout transitions.
	Rollouts *prometheus.CounterVec
	// Remediations are the health checks' metrics.
	Remediations *machinehealthcheck.Metrics
}

// New builds a manager running the Machine, MachineSet, MachineDeployment
// and MachineHealthCheck controllers.
func New(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, opts Options) (*Manager, error) {
	cfg = rest.CopyConfig(cfg)
	if opts.QPS > 0 {
		cfg.QPS = opts.QPS
	}
	if opts.Burst > 0 {
		cfg.Burst = opts.Burst
	}
	addr := opts.MetricsAddr
	if addr == "" {
		addr = "0"
	}
	health := opts.HealthAddr
	if health == "" {
		health = "0"
	}
	served, err := metricsServing(opts, addr)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := awaitAPI(ctx, kube, health); err != nil {
		return nil, err
	}
	checks := &machinehealthcheck.Reconciler{NodeGrace: opts.NodeGrace, Calendar: opts.Now}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// A watch that failed may mean the API server was out of reach:
		// the health checks then distrust stale Node conditions a while.
		Cache: cache.Options{
			DefaultWatchErrorHandler: checks.WatchError,
			// The cache holds every Machine, Node and Lease: only what the
			// controllers read is kept (docs/benchmarks.md, memory).
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject:         map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: trimNode}},
		},
		Metrics:                 served,
		HealthProbeBindAddress:  health,
		PprofBindAddress:        cmp.Or(opts.PprofAddr, "0"),
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "machinist-manager",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		// A new leader starts at once when the old one stops cleanly.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 durationOrNil(opts.LeaseDuration),
		RenewDeadline:                 durationOrNil(opts.RenewDeadline),
		RetryPeriod:                   durationOrNil(opts.RetryPeriod),
	})
	if err != nil {
		return nil, err
	}
	if health != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		// Ready once the caches have synced: before that a reconcile
		// would act on an empty world.
		if err := mgr.AddReadyzCheck("caches", func(req *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(req.Context()) {
				return errors.New("caches not synced")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	metrics := machine.NewMetrics(mgr.GetClient())
	reg := opts.Registry
	if reg == nil {
		reg = crmetrics.Registry
	}
	if err := metrics.Register(reg); err != nil {
		return nil, err
	}
	calls := providers.NewMetrics(opts.Actuators)
	if err := errors.Join(calls.Register(reg), reg.Register(gauges.New(mgr.GetClient()))); err != nil {
		return nil, err
	}
	opts.Actuators.Meter(calls)
	// Where every Machine's Node lives, for the Machine controller and the
	// health checks alike: today, this cluster.
	caData, err := caBundle(cfg)
	if err != nil {
		return nil, err
	}
	local := &nodes.API{Client: mgr.GetClient(), Kube: kube, Server: cfg.Host, CAData: caData}
	if opts.JoinServer != "" {
		local.Server, local.CAData = opts.JoinServer, opts.JoinCAData
	}
	if opts.KubeconfigTrust.Exec {
		ctrl.Log.WithName("workloadcluster").Info("WARNING: the kubeconfigs of WorkloadClusters may run commands in the manager (" + clusters.ExecFlag + "): whoever may write their Secrets may run code here")
	}
	if opts.KubeconfigTrust.InsecureTLS {
		ctrl.Log.WithName("workloadcluster").Info("WARNING: the kubeconfigs of WorkloadClusters may skip verifying their servers (" + clusters.InsecureTLSFlag + "): the clusters' credentials go to whoever answers at their addresses")
	}
	nodeSide, err := clusters.NewRegistry(clusters.Options{
		Local: local, QPS: opts.ClusterQPS, Burst: opts.ClusterBurst,
		WatchError: checks.WatchError, TrimNode: trimNode, Trust: opts.KubeconfigTrust,
	})
	if err != nil {
		return nil, err
	}
	workload := &workloadcluster.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Registry: nodeSide,
		Recorder: mgr.GetEventRecorder("machinist-workloadcluster"), ProbePeriod: opts.ClusterProbePeriod,
		UnreachableAfter: opts.ClusterUnreachableAfter, JoinableProbePeriod: opts.ClusterJoinablePeriod,
	}
	if err := workload.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineSetWorkers, 4), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	own, err := managementClusterServed(mgr, opts.ManagementJoinable)
	if err != nil {
		return nil, err
	}
	if own {
		mc := &managementcluster.Reconciler{Client: mgr.GetClient(), Config: cfg, JoinableProbePeriod: opts.ClusterJoinablePeriod}
		if err := mc.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &opts.Repeatable}); err != nil {
			return nil, err
		}
	}
	machines := &machine.Reconciler{
		Client:           mgr.GetClient(),
		Nodes:            nodeSide,
		Connections:      nodeSide,
		Recorder:         mgr.GetEventRecorder("machinist-machine"),
		Actuators:        opts.Actuators,
		Metrics:          metrics,
		ProvisionTimeout: opts.ProvisionTimeout,
		Backoff:          opts.Backoff,
		DrainPoll:        opts.DrainPoll,
		OperationTimeout: opts.OperationTimeout,
		APIReader:        mgr.GetAPIReader(),
		Calendar:         opts.Now,
		DriftDelay:       opts.DriftDelay,
		Namespace:        opts.Namespace,
		OwnCluster:       own,
	}
	if err := machines.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineWorkers, 16), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	sets := &machineset.Reconciler{
		Client:     mgr.GetClient(),
		APIReader:  mgr.GetAPIReader(),
		Recorder:   mgr.GetEventRecorder("machinist-machineset"),
		Calendar:   opts.Now,
		PerMachine: opts.PerMachine,
	}
	if err := sets.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineSetWorkers, 4), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	rollouts := machinedeployment.NewTransitionsMetric()
	if err := reg.Register(rollouts); err != nil {
		return nil, err
	}
	deployments := &machinedeployment.Reconciler{
		Client:      mgr.GetClient(),
		Recorder:    mgr.GetEventRecorder("machinist-machinedeployment"),
		Transitions: rollouts,
		Actuators:   opts.Actuators,
		APIReader:   mgr.GetAPIReader(),
		Calendar:    opts.Now,
		PerMachine:  opts.PerMachine,
	}
	if err := deployments.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineSetWorkers, 4), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	remediations := machinehealthcheck.NewMetrics()
	if err := remediations.Register(reg); err != nil {
		return nil, err
	}
	checks.Connections = nodeSide
	checks.Client, checks.Nodes, checks.APIReader, checks.Recorder, checks.Metrics = mgr.GetClient(), nodeSide, mgr.GetAPIReader(), mgr.GetEventRecorder("machinist-machinehealthcheck"), remediations
	if err := checks.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineSetWorkers, 4), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	if opts.InventoryPeriod >= 0 {
		counts := inventory.NewMetrics()
		if err := counts.Register(reg); err != nil {
			return nil, err
		}
		if err := mgr.Add(&inventory.Checker{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Actuators: opts.Actuators,
			Recorder: mgr.GetEventRecorder("machinist-inventory"), Period: opts.InventoryPeriod,
			OrphanGrace: opts.OrphanDeletionGrace, GhostLimit: opts.GhostReplacementLimit, Clusters: nodeSide, Metrics: counts,
		}); err != nil {
			return nil, err
		}
	}
	budgets := &machinedisruptionbudget.Reconciler{Client: mgr.GetClient(), Now: opts.Now}
	if err := budgets.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: or(opts.MachineSetWorkers, 4), SkipNameValidation: &opts.Repeatable}); err != nil {
		return nil, err
	}
	return &Manager{Manager: mgr, Metrics: metrics, Rollouts: rollouts, Remediations: remediations}, nil
}

// awaitAPI waits until kube-apiserver serves Machinist's API group. The
// controllers' indexes need discovery as they are set up, so a manager
// started while kube-apiserver is down (as after an outage, which ends a
// leader's term) would otherwise exit at once, and again at each restart:
// a crash loop. It waits instead, saying so, until ctx ends. Meanwhile it
// answers the probes on healthAddr ("0": none): alive, not ready, so that
// a kubelet's liveness probe does not restart a process that is only
// waiting.
func awaitAPI(ctx context.Context, kube kubernetes.Interface, healthAddr string) error {
	log := ctrl.Log.WithName("manager")
	gv := machinistv1.GroupVersion.String()
	delay, waited := 250*time.Millisecond, false
	var probes *http.Server
	defer func() {
		if probes != nil {
			// Before the manager binds the same address.
			_ = probes.Close()
		}
	}()
	for {
		_, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
		if err == nil {
			if waited {
				log.Info("kube-apiserver serves " + gv + "; starting")
			}
			return nil
		}
		log.Info("waiting for kube-apiserver to serve "+gv, "error", err.Error(), "retryIn", delay.String())
		if !waited && healthAddr != "0" {
			probes = waitingProbes(healthAddr, "waiting for kube-apiserver to serve "+gv)
		}
		waited = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver to serve %s: %w (last error: %v)", gv, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// waitingProbes serves /healthz (ok) and /readyz (503, why) on addr until
// closed. A failure to listen is logged, not fatal: probes are a courtesy
// here, and the manager reports the same address's error when it starts.
func waitingProbes(addr, why string) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, why, http.StatusServiceUnavailable) })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		ctrl.Log.WithName("manager").Error(err, "serving the probes while waiting for kube-apiserver")
		return nil
	}
	go func() { _ = srv.Serve(ln) }()
	return srv
}

// managementClusterServed reports whether the ManagementCluster is
// wanted and its kind served: a manager upgraded before its CRDs were
// applied goes on without it, saying so, rather than wait for good on a
// watch of a kind the cluster does not serve.
func managementClusterServed(mgr ctrl.Manager, wanted bool) (bool, error) {
	if !wanted {
		return false, nil
	}
	gk := machinistv1.GroupVersion.WithKind("ManagementCluster").GroupKind()
	_, err := mgr.GetRESTMapper().RESTMapping(gk, machinistv1.GroupVersion.Version)
	if meta.IsNoMatchError(err) {
		ctrl.Log.WithName("managementcluster").Info("the cluster does not serve the ManagementCluster kind, so whether machines can join it is not checked: apply Machinist's CRDs (config/crd) and restart the manager")
		return false, nil
	}
	return err == nil, err
}

func or(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// durationOrNil leaves a zero duration to controller-runtime's default.
func durationOrNil(d time.Duration) *time.Duration {
	if d <= 0 {
		return nil
	}
	return &d
}

// trimNode keeps of a cached Node what the controllers read: its metadata
// (without managed fields), spec, conditions and node info. Images,
// volumes, addresses, capacity and the rest of its status are the larger
// part of a Node and nothing here reads them. Writes to Nodes are merge
// patches computed from the cached copy, so what is dropped here is never
// sent back.
func trimNode(o any) (any, error) {
	node, ok := o.(*corev1.Node)
	if !ok {
		return o, nil
	}
	node.ManagedFields = nil
	node.Status = corev1.NodeStatus{
		Conditions: node.Status.Conditions,
		NodeInfo:   node.Status.NodeInfo,
	}
	return node, nil
}

// caBundle is the PEM that verifies the manager's own API server: what a
// machine of the self-managed cluster is given to join with.
func caBundle(cfg *rest.Config) ([]byte, error) {
	if len(cfg.CAData) > 0 || cfg.CAFile == "" {
		return cfg.CAData, nil
	}
	return os.ReadFile(cfg.CAFile)
}
