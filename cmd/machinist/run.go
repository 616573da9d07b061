package main

import (
	"path/filepath"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/machinist-dev/machinist/local"
)

func runCommand() *cobra.Command {
	var (
		opts local.Options
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run everything on this host: control plane, controllers, verbs server, machines as processes",
		Long: `Run Machinist on this host, ready for kubectl: etcd and kube-apiserver
from --bin-dir, the CRDs and ClusterRoles, the controllers, the verbs
server, and the process provider, whose Machines are local processes.

Everything is kept in --state-dir, so a second run picks up where the last
one stopped. The first run creates MachineClass "local", MachineDeployment
"workers" (3 Machines), MachineSet "spare" (0) and MachineHealthCheck
"workers" (which heals the MachineDeployment's Machines) in namespace
default. Ctrl-C stops everything it started.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.setUp(); err != nil {
				return err
			}
			opts.Out = cmd.OutOrStdout()
			return local.Run(ctrl.SetupSignalHandler(), opts)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&opts.StateDir, "state-dir", ".machinist", "where etcd's data, certificates, machines and the kubeconfig are kept")
	fs.StringVar(&opts.BinDir, "bin-dir", filepath.Join(".", "bin"), "where etcd and kube-apiserver are (make controlplane builds them)")
	fs.StringVar(&opts.AgentBinary, "agent-binary", "", "the machinist binary each machine runs as its agent; empty means this one")
	logs.add(fs)
	// The controllers log every transition; a person at a terminal wants
	// the summary, not the stream.
	fs.Lookup("log-level").DefValue = "error"
	_ = fs.Set("log-level", "error")
	return cmd
}
