// Command machinist is Machinist's one binary; each job is a subcommand.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/grpclog"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

func main() {
	// Booted as a qemu machine's init (PID 1), from its initramfs.
	if guest.IsInit() {
		guest.Init(os.Args[1:])
	}
	// gRPC's own warnings (a provider that does not answer yet) reach
	// people as the Machines' conditions; on the terminal they are noise.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "machinist:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "machinist",
		Short:         "Declarative machine lifecycle for Kubernetes",
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(fsmCommand())
	cmd.AddCommand(agentCommand())
	cmd.AddCommand(cli.ManagerCommand())
	cmd.AddCommand(apiserverCommand())
	cmd.AddCommand(runCommand())
	cmd.AddCommand(providerCommand())
	cmd.AddCommand(faultProxyCommand())
	cmd.AddCommand(migrateCommand())
	cmd.AddCommand(moveCommand())
	cmd.AddCommand(clusterCommand())
	return cmd
}
