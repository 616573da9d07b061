package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// agentOptions are the flags of machinist agent.
type agentOptions struct {
	kubeconfig   string
	bootstrap    string
	nodeName     string
	providerID   string
	version      string
	leaseSeconds int32
	renew        time.Duration
	bootIDFile   string
	capacity     map[string]string
	neverReady   bool
	hostInfo     bool
}

// agentCommand runs one node agent as its own OS process: the machine of the
// process provider, or a stand-in kubelet anywhere else.
func agentCommand() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run one node agent (a kubelet stand-in) until SIGTERM or SIGINT",
		Long: `Run one node agent: register a Node, keep its Lease in kube-node-lease
renewed and run the pods bound to it, until SIGTERM or SIGINT, which stop the
renewals and exit 0. Every start is a new boot: the Node reports a new boot ID.
A process killed outright leaves a Lease that expires, which the Machine
controller reports as an unhealthy Node.

With --bootstrap-kubeconfig the agent joins the cluster as a kubelet does:
it trades the bootstrap token for a client certificate of its own
(system:node:<node name>), approved and signed by the cluster, keeps it in
--kubeconfig, readable by it alone, and starts with it from then on while it
is valid. A machine whose --kubeconfig does not exist yet (a new or
re-imaged one) first deletes the Node and Lease a previous life left under
its name, so that its Node registers afresh. Without --bootstrap-kubeconfig,
--kubeconfig is the credentials it runs with.`,
		Example: `  machinist agent --bootstrap-kubeconfig /var/lib/m1/bootstrap-kubeconfig \
    --kubeconfig /var/lib/m1/kubeconfig --node-name n1 \
    --provider-id process:///default/m1/0b5c… --version v1.37.2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return runAgent(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; with --bootstrap-kubeconfig, where the node's own credentials are kept; required unless running in a cluster")
	f.StringVar(&o.bootstrap, "bootstrap-kubeconfig", "", "kubeconfig holding a bootstrap token, to get the node's own credentials with when --kubeconfig holds none that are valid")
	f.StringVar(&o.nodeName, "node-name", "", "name of the Node to register (required)")
	f.StringVar(&o.providerID, "provider-id", "", "the Node's spec.providerID (required)")
	f.StringVar(&o.version, "version", "", "kubelet version to report in status.nodeInfo")
	f.Int32Var(&o.leaseSeconds, "lease-duration-seconds", nodeagent.DefaultLeaseDurationSeconds, "the Lease's duration")
	f.DurationVar(&o.renew, "renew-interval", nodeagent.DefaultRenewInterval, "how often the Lease is renewed")
	f.StringVar(&o.bootIDFile, "boot-id-file", "", "file to write this boot's ID to as the process starts, before it joins")
	f.StringToStringVar(&o.capacity, "capacity", nil, "resources the Node offers over the defaults, e.g. cpu=16,memory=64Gi")
	f.BoolVar(&o.neverReady, "never-ready", false, "report the Node Ready=False (while renewing the Lease)")
	f.BoolVar(&o.hostInfo, "host-info", false, "report this host's kernel boot ID, kernel version and OS image (on a real machine, such as a qemu provider's VM) rather than a boot of this process's own")
	_ = cmd.MarkFlagRequired("node-name")
	_ = cmd.MarkFlagRequired("provider-id")
	return cmd
}

func runAgent(ctx context.Context, o agentOptions) error {
	// klog, as client-go logs: one plain-text stream on stderr, without
	// the stack traces zap adds to every retried error.
	ctrllog.SetLogger(klog.NewKlogr())
	if o.leaseSeconds <= 0 || o.renew <= 0 {
		return errors.New("--lease-duration-seconds and --renew-interval must be positive")
	}
	capacity := corev1.ResourceList{}
	for name, value := range o.capacity {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return fmt.Errorf("--capacity %s=%s: %w", name, value, err)
		}
		capacity[corev1.ResourceName(name)] = q
	}
	// The process's start is the machine's boot: its ID is known, and
	// told to a provider that asks, before the machine has joined (a
	// repaired one may wait long for a cluster that is down).
	bootID := string(uuid.NewUUID())
	var host nodeagent.Host
	if o.hostInfo {
		var err error
		if host, err = nodeagent.ReadHost(); err != nil {
			return fmt.Errorf("--host-info: %w", err)
		}
		bootID = host.BootID
	}
	if o.bootIDFile != "" {
		// A failure ends the process, and so the boot: a provider that
		// asked for the file relies on it.
		if err := writeFileAtomic(o.bootIDFile, []byte(bootID+"\n")); err != nil {
			return fmt.Errorf("--boot-id-file: %w", err)
		}
	}
	cfg, err := agentRESTConfig(ctx, o)
	if ctx.Err() != nil {
		// Stopped while joining: a clean stop, as one while running is.
		return nil
	}
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	agent := nodeagent.New(nodeagent.Config{
		Client:               client,
		NodeName:             o.nodeName,
		ProviderID:           o.providerID,
		Version:              o.version,
		Capacity:             capacity,
		LeaseDurationSeconds: o.leaseSeconds,
		RenewInterval:        o.renew,
		NeverReady:           o.neverReady,
		BootID:               bootID,
		KernelVersion:        host.KernelVersion,
		OSImage:              host.OSImage,
		MachineID:            host.MachineID,
	})
	return agent.Run(ctx)
}

func agentRESTConfig(ctx context.Context, o agentOptions) (*rest.Config, error) {
	if o.bootstrap != "" {
		if o.kubeconfig == "" {
			return nil, errors.New("--bootstrap-kubeconfig needs --kubeconfig, where the node's own credentials are kept")
		}
		// The join's lines go to standard output, which the provider
		// keeps (an agent's log, a VM's console), for its Describe.
		creds, err := nodeagent.Bootstrap(ctx, o.bootstrap, o.kubeconfig, o.nodeName, o.providerID, nodeagent.ReportJoin(os.Stdout))
		if err != nil {
			return nil, fmt.Errorf("joining the cluster: %w", err)
		}
		nodeagent.ReportJoined(os.Stdout)
		return creds.Config(), nil
	}
	if o.kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not running in a cluster (%w): --kubeconfig is required", err)
	}
	return cfg, nil
}

// writeFileAtomic replaces path so that a reader never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
