package main

import (
	"path/filepath"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/dev/local"
)

func runCommand() *cobra.Command {
	var (
		opts local.Options
		logs cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run everything on this host: a management and a workload cluster, controllers, verbs server, machines as processes",
		Long: `Run Machinist on this host, ready for kubectl: two clusters, each with etcd,
kube-apiserver and kube-controller-manager from --bin-dir. The management
cluster gets the CRDs and ClusterRoles, the controllers, the verbs server
and the process provider, whose Machines are local processes; the
workload cluster "workload" is where the workers' Nodes are.

Everything is kept in --state-dir (the workload cluster in its workload/),
so a second run picks up where the last one stopped, with each cluster's
address and certificates unchanged. The first run creates, in namespace
default, WorkloadCluster "workload" (reading Secret "workload-kubeconfig",
written at every start), MachineClass "local", MachineDeployment
"workers" (3 Machines in the workload cluster), MachineSet "spare" (0, in
the management cluster), MachineHealthCheck "workers" (which heals the
MachineDeployment's Machines) and MachineDisruptionBudget "workers".
Ctrl-C stops everything it started.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.SetUp(); err != nil {
				return err
			}
			opts.Out = cmd.OutOrStdout()
			return local.Run(ctrl.SetupSignalHandler(), opts)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&opts.StateDir, "state-dir", ".machinist", "where both clusters' etcd data, certificates, ports and kubeconfigs, and the machines, are kept")
	fs.StringVar(&opts.BinDir, "bin-dir", filepath.Join(".", "bin"), "where etcd and kube-apiserver are (make controlplane builds them)")
	fs.StringVar(&opts.AgentBinary, "agent-binary", "", "the machinist binary each machine runs as its agent; empty means this one")
	logs.Add(fs)
	// The controllers log every transition; a person at a terminal wants
	// the summary, not the stream.
	fs.Lookup("log-level").DefValue = "error"
	_ = fs.Set("log-level", "error")
	return cmd
}
