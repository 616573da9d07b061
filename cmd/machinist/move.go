package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/cmd/internal/move"
	"github.com/machinist-dev/machinist/controllers/machine"
)

func moveCommand() *cobra.Command {
	var (
		from, to, namespace    string
		managerNS, toManagerNS string
		dryRun                 bool
		timeout                time.Duration
		qps                    float32
	)
	cmd := &cobra.Command{
		Use:   "move",
		Short: "Move a namespace's Machinist objects to another management cluster, touching no instance",
		Long: `Moves every Machinist object of a namespace (MachineClasses, MachineDrainRules,
WorkloadClusters, MachineDeployments, MachineSets, Machines, MachineHealthChecks,
MachineDisruptionBudgets), with its status, and the kubeconfig Secrets its
WorkloadClusters name, from the cluster of --kubeconfig to the one of
--to-kubeconfig. It pauses them on the source (machinist.dev/paused), copies
them in the order they name each other with owner references remapped to the
new UIDs, resumes the copies, and deletes the originals with their finalizers
released, not run. No instance is created, deleted or restarted: each Machine
on the target drives the same instance and Node. The target's manager must run
the same providers. A move stopped half way is finished by running it again; a
target that holds an object of the same name it did not copy is refused before
anything is written. The bootstrap token the source's manager keeps for a
machine repaired while its cluster could not be reached (status.keptToken)
moves from --manager-namespace to --to-manager-namespace, where the target's
manager runs: it publishes the token once the cluster answers, and the machine
joins with it. --dry-run prints what would move.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" || namespace == "" {
				return errors.New("--to-kubeconfig and --namespace are required")
			}
			scheme := runtime.NewScheme()
			if err := errors.Join(clientgoscheme.AddToScheme(scheme), machinistv1.AddToScheme(scheme)); err != nil {
				return err
			}
			clients := make([]client.Client, 2)
			for i, file := range []string{from, to} {
				cfg, err := cli.RestConfig(file)
				if err != nil {
					return err
				}
				// client-go's default of 5 requests a second would make a
				// move of 1,000 Machines (8 requests each) take half an hour.
				cfg.QPS, cfg.Burst = qps, 2*int(qps)
				if clients[i], err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
					return err
				}
			}
			ctx, cancel := cli.Deadline(cmd.Context(), timeout)
			defer cancel()
			return move.Run(ctx, move.Options{From: clients[0], To: clients[1], Namespace: namespace,
				ManagerNamespace: managerNS, ToManagerNamespace: toManagerNS, DryRun: dryRun, Out: cmd.OutOrStdout()})
		},
	}
	cmd.Flags().StringVar(&from, "kubeconfig", "", "the source management cluster (empty: in-cluster)")
	cmd.Flags().StringVar(&to, "to-kubeconfig", "", "the target management cluster")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "the namespace whose objects move")
	cmd.Flags().StringVar(&managerNS, "manager-namespace", machine.DefaultNamespace, "the namespace the source's manager runs in (its --namespace)")
	cmd.Flags().StringVar(&toManagerNS, "to-manager-namespace", machine.DefaultNamespace, "the namespace the target's manager runs in (its --namespace)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would move, and write nothing")
	cmd.Flags().Float32Var(&qps, "qps", 100, "requests per second to each cluster's kube-apiserver (and twice as many in a burst)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long; running it again goes on from where it stopped")
	return cmd
}
