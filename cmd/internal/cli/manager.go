package cli

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// ManagerCommand is `manager`: the controllers.
func ManagerCommand() *cobra.Command {
	var (
		kubeconfig string
		opts       manager.Options
		machines   process.Options
		vms        qemu.Options
		remotes    []string
		remoteOpts plugin.DialOptions
		goroutines inmemory.Options
		logs       LogFlags
		joinCAFile string
		ghostLimit int
	)
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the controllers: Machines, MachineSets, MachineDeployments and MachineHealthChecks",
		Long: `Run Machinist's controllers against a cluster. Several replicas may run
with --leader-elect; one acts at a time.

Providers: --provider NAME=ENDPOINT (repeatable) reaches a provider that
runs out of process and speaks the provider protocol (docs/providers.md),
on a Unix socket (unix:///path, a sidecar) or over TCP with mutual TLS
(tcp://host:port and --provider-tls-*). Built in: "inmemory" (machines as
goroutines in this process, for trying Machinist out) unless a --provider
takes its name; "process" (machines as agent processes on this host) with
--process-state-dir; "qemu" (machines as QEMU VMs on this host) with
--qemu-state-dir. Their machines outlive the manager, and the leader takes
them over from the state directory, so replicas on one host share it.

A leader that cannot renew its Lease within --leader-elect-renew-deadline
(for example while kube-apiserver is down) exits with status 1 and the
message "leader election lost", to be restarted as a Deployment restarts a
container; a replica started while kube-apiserver is down waits for it,
logging "waiting for kube-apiserver", instead of exiting again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.SetUp(); err != nil {
				return err
			}
			cfg, err := RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			if joinCAFile != "" {
				if opts.JoinCAData, err = os.ReadFile(joinCAFile); err != nil {
					return fmt.Errorf("--join-ca-file: %w", err)
				}
			}
			if (opts.JoinServer == "") != (joinCAFile == "") {
				return errors.New("--join-server and --join-ca-file go together: new machines need both the address and the CA that verifies it")
			}
			switch {
			case ghostLimit < 0 || ghostLimit > 100:
				return fmt.Errorf("--ghost-replacement-limit=%d: a percentage, from 0 (never replace) to 100", ghostLimit)
			case ghostLimit == 0:
				opts.GhostReplacementLimit = -1
			default:
				opts.GhostReplacementLimit = ghostLimit
			}
			ctx := ctrl.SetupSignalHandler()
			opts.Actuators = providers.NewRegistry()
			clients, err := registerRemotes(opts.Actuators, remotes, remoteOpts)
			for _, c := range clients {
				defer func() { _ = c.Close() }()
			}
			if err != nil {
				return err
			}
			if !slices.Contains(opts.Actuators.Names(), inmemory.Name) {
				p, err := inmemory.New(goroutines)
				if err != nil {
					return err
				}
				defer p.Stop()
				if err := opts.Actuators.Register(inmemory.Name, p); err != nil {
					return err
				}
			}
			if machines.StateDir != "" {
				if slices.Contains(opts.Actuators.Names(), process.Name) {
					return fmt.Errorf("--process-state-dir runs the process provider in this manager, but --provider already reaches one out of process: give one or the other")
				}
				// Never stopped: the machines outlive the manager, as real
				// ones outlive a controller.
				p, err := process.New(machines)
				if err != nil {
					return err
				}
				if err := opts.Actuators.Register(process.Name, p); err != nil {
					return err
				}
			}
			if vms.StateDir != "" {
				if slices.Contains(opts.Actuators.Names(), qemu.Name) {
					return fmt.Errorf("--qemu-state-dir runs the qemu provider in this manager, but --provider already reaches one out of process: give one or the other")
				}
				vms.Log = ctrl.Log.WithName("qemu")
				vms.LeaseDurationSeconds, vms.RenewInterval = machines.LeaseDurationSeconds, machines.RenewInterval
				p, err := qemu.New(vms)
				if err != nil {
					return err
				}
				if err := opts.Actuators.Register(qemu.Name, p); err != nil {
					return err
				}
			}
			scheme, err := managerScheme()
			if err != nil {
				return err
			}
			mgr, err := manager.New(ctx, cfg, scheme, opts)
			if err != nil {
				if ctx.Err() != nil {
					// Stopped while waiting for kube-apiserver: a clean stop.
					return nil
				}
				return err
			}
			return mgr.Start(ctx)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster; empty means in-cluster credentials")
	fs.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader among replicas (Lease machinist-manager)")
	fs.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader Lease; empty means the pod's own")
	fs.DurationVar(&opts.LeaseDuration, "leader-elect-lease-duration", 0, "how long a candidate waits after the leader's last renewal before it takes over (0: 15s)")
	fs.DurationVar(&opts.RenewDeadline, "leader-elect-renew-deadline", 0, "how long the leader keeps trying to renew before it gives up and exits (0: 10s)")
	fs.DurationVar(&opts.RetryPeriod, "leader-elect-retry-period", 0, "how often candidates try to take the Lease and the leader renews it (0: 2s)")
	fs.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", `address of /metrics; "0" turns it off`)
	fs.BoolVar(&opts.MetricsSecure, "metrics-secure", false,
		"serve /metrics over HTTPS to bearer tokens kube-apiserver authenticates and allows get on /metrics (ClusterRole machinist-metrics-reader); off, plain HTTP to anyone who reaches it")
	fs.StringVar(&opts.MetricsCertDir, "metrics-cert-dir", "", "tls.crt and tls.key for --metrics-secure, reloaded when they change; empty means a self-signed certificate made at start")
	fs.StringVar(&opts.PprofAddr, "pprof-bind-address", "0", `address of Go's /debug/pprof profiles; "0" turns them off`)
	fs.StringVar(&opts.HealthAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz; "0" turns them off`)
	fs.IntVar(&opts.MachineWorkers, "machine-workers", 16, "Machines reconciled at once")
	fs.IntVar(&opts.MachineSetWorkers, "set-workers", 4, "MachineSets, and MachineDeployments, reconciled at once")
	fs.StringVar(&opts.JoinServer, "join-server", "", "the API server address new machines of this cluster join (a kubeadm cluster's control plane endpoint); empty means the one the manager reaches, which in a pod is the kubernetes Service, out of a machine's reach")
	fs.StringVar(&joinCAFile, "join-ca-file", "", "the CA bundle that verifies --join-server")
	fs.Float32Var(&opts.ClusterQPS, "cluster-api-qps", 0, "requests per second to each workload cluster's API server, apart from --kube-api-qps; a Machine joining one costs about 3 (0: 100)")
	fs.IntVar(&opts.ClusterBurst, "cluster-api-burst", 0, "burst of requests to each workload cluster's API server (0: 200)")
	fs.DurationVar(&opts.ClusterProbePeriod, "cluster-probe-period", 0, "how often each workload cluster is probed and its status counted (0: 30s)")
	fs.DurationVar(&opts.ClusterJoinablePeriod, "cluster-joinable-period", joinprobe.DefaultPeriod,
		"how often each connected workload cluster's join checks run again, for its Joinable condition (a Machine's failed join also runs them, at most once a minute); the management cluster's too")
	fs.DurationVar(&opts.InventoryPeriod, "inventory-period", inventory.DefaultPeriod,
		"how often every provider that can list its instances is compared with the Machines, to report orphans (instances made for a Machine that is gone) and ghosts (Machines whose instance is gone); negative: never")
	fs.DurationVar(&opts.OrphanDeletionGrace, "orphan-deletion-grace", 0,
		"delete an orphan instance once it has been reported this long and no Machine claimed it; 0: never (report only). Set it only when the providers' instances are this manager's alone")
	fs.IntVar(&ghostLimit, "ghost-replacement-limit", inventory.DefaultGhostLimit,
		"replace a ghost Machine (its instance gone) of a MachineSet by deleting it, unless more than this percentage of its set's Machines, or of its provider's, are ghosts at once (a provider that lost track of its instances): then report only; 0: never replace")
	fs.BoolVar(&opts.ManagementJoinable, "management-cluster-joinable", true,
		"keep the ManagementCluster, whose Joinable condition says whether machines can join this cluster (its checks make a short-lived bootstrap token and a certificate request here); false: neither the object nor the checks")
	fs.StringVar(&opts.Namespace, "namespace", cmp.Or(os.Getenv("POD_NAMESPACE"), machine.DefaultNamespace),
		"the manager's own namespace, where it keeps what no tenant may read or write: the bootstrap tokens of machines repaired while their cluster is down")
	fs.BoolVar(&opts.KubeconfigTrust.Exec, strings.TrimPrefix(clusters.ExecFlag, "--"), false,
		"let WorkloadClusters' kubeconfigs run exec credential plugins in the manager: whoever may write their Secrets may then run code here")
	fs.BoolVar(&opts.KubeconfigTrust.InsecureTLS, strings.TrimPrefix(clusters.InsecureTLSFlag, "--"), false,
		"let WorkloadClusters' kubeconfigs skip verifying their servers (insecure-skip-tls-verify, http://): their credentials then go to whoever answers")
	fs.DurationVar(&opts.ClusterUnreachableAfter, "cluster-unreachable-after", 0,
		"how long a workload cluster that answered must fail its probes before it is called unreachable, its health checks frozen and its drains held (0: 40s)")
	fs.Float32Var(&opts.QPS, "kube-api-qps", 200, "requests per second to the API server")
	fs.IntVar(&opts.Burst, "kube-api-burst", 400, "burst of requests to the API server")
	fs.DurationVar(&opts.ProvisionTimeout, "provision-timeout", 0, "how long a Machine may provision before it is Failed (0: 10m)")
	fs.DurationVar(&opts.OperationTimeout, "operation-timeout", 0, "how long a reboot or repair may take before the Machine is Failed (0: 10m)")
	fs.DurationVar(&opts.NodeGrace, "node-grace", 0, "how long after the manager starts, or a watch fails, before a Node condition counts against a Machine in a health check (0: 40s)")
	fs.Int32Var(&goroutines.LeaseDurationSeconds, "inmemory-lease-duration-seconds", 0, "the in-process inmemory provider's Node Lease duration (0: 40)")
	fs.DurationVar(&goroutines.RenewInterval, "inmemory-renew-interval", 0, "how often the in-process inmemory provider's machines renew their Leases (0: 10s)")
	fs.StringArrayVar(&remotes, "provider", nil, "NAME=ENDPOINT: a provider served out of process, at unix:///path or tcp://host:port (repeatable)")
	AddClientTLSFlags(fs, "provider-", &remoteOpts.TLS)
	fs.DurationVar(&remoteOpts.Timeout, "provider-timeout", 0, "how long one call to an out-of-process provider may take (0: 30s)")
	fs.StringVar(&machines.StateDir, "process-state-dir", "", `turn on the "process" provider, keeping its machines' state here`)
	fs.StringVar(&machines.AgentBinary, "process-agent-binary", "", "the machinist binary the agents run; empty means this one")
	fs.Int32Var(&machines.LeaseDurationSeconds, "process-lease-duration-seconds", 0, "the agents' Node Lease duration, of the process and qemu providers (0: 40)")
	fs.DurationVar(&machines.RenewInterval, "process-renew-interval", 0, "how often the agents of the process and qemu providers renew their Node Leases (0: 10s)")
	AddQEMUFlags(fs, &vms)
	logs.Add(fs)
	return cmd
}

// registerRemotes dials each NAME=ENDPOINT and registers it. Dialing does
// not wait for the provider: one that is not up yet makes its Machines
// wait (ProviderUnavailable), which is what a manager starting beside
// its providers wants.
func registerRemotes(reg *providers.Registry, specs []string, opts plugin.DialOptions) ([]*plugin.Client, error) {
	var clients []*plugin.Client
	for _, spec := range specs {
		name, endpoint, ok := strings.Cut(spec, "=")
		if !ok || name == "" || endpoint == "" {
			return clients, fmt.Errorf("--provider %q: want NAME=ENDPOINT, such as process=unix:///run/machinist/process.sock", spec)
		}
		c, err := plugin.Dial(name, endpoint, opts)
		if err != nil {
			return clients, fmt.Errorf("--provider %s: %w", spec, err)
		}
		clients = append(clients, c)
		if err := reg.Register(name, c); err != nil {
			return clients, fmt.Errorf("--provider %s: %w", spec, err)
		}
	}
	return clients, nil
}

// managerScheme knows the kinds the controllers read and write.
func managerScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, machinistv1.AddToScheme(s)
}
