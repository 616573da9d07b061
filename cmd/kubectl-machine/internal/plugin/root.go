// Package plugin implements kubectl-machine, the kubectl plugin for
// Machinist's Machines and MachineDeployments.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Main runs the plugin with args (without the program name) and returns
// the process exit code.
func Main(args []string, streams genericiooptions.IOStreams) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := New(streams)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	if err != nil {
		fmt.Fprintln(streams.ErrOut, "error:", err)
	}
	return ExitCode(err)
}

// New returns the root command. Errors are returned, not printed: Main
// prints them once and turns them into exit codes.
func New(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), streams: streams}
	cmd := &cobra.Command{
		Use:   "kubectl-machine",
		Short: "Reboot, repair and inspect Machines; manage MachineDeployment rollouts; get a WorkloadCluster's kubeconfig",
		Long: `Reboot, repair and inspect Machinist Machines, manage the rollouts of
MachineDeployments the way 'kubectl rollout' manages Deployments, and print
the kubeconfig of a WorkloadCluster.

` + exitCodesHelp,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl machine"},
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	// Kept for kubectl's plugin completion (kubectl_complete-machine), but
	// not listed among the commands.
	cmd.CompletionOptions.HiddenDefaultCmd = true
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)
	o.flags.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(o.verbCommand(reboot), o.verbCommand(repair), o.statusCommand(), o.rolloutCommand(), o.kubeconfigCommand())
	return cmd
}

// options are what every command shares: the kubeconfig flags and streams.
type options struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
}

// cluster is a connection to the API server for one command.
type cluster struct {
	namespace string
	config    *rest.Config
	client    client.WithWatch
}

func (o *options) connect() (*cluster, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &cluster{namespace: ns, config: cfg, client: c}, nil
}

// withTimeout bounds a wait; zero means no bound, as in kubectl.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// group is the API group of the kinds the plugin works on, as it appears
// in fully qualified names such as machinedeployment.machinist.dev/NAME.
var group = machinistv1.GroupVersion.Group

// scheme knows Machinist's kinds and the core group, whose Secrets hold
// WorkloadClusters' kubeconfigs.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(machinistv1.AddToScheme(s))
	utilruntime.Must(corev1.AddToScheme(s))
	return s
}()
