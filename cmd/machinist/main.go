// Command machinist is Machinist's one binary; each job is a subcommand.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "machinist:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "machinist",
		Short:         "Declarative machine lifecycle for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(fsmCommand())
	cmd.AddCommand(agentCommand())
	cmd.AddCommand(managerCommand())
	cmd.AddCommand(apiserverCommand())
	cmd.AddCommand(runCommand())
	return cmd
}
