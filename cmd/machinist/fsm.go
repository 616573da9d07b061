package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/controllers/machinehealthcheck"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

// diagrams are the state machines machinist fsm prints, by name.
var diagrams = map[string]func(format string) (string, error){
	"machine":     phases.Diagram,
	"rollout":     machinedeployment.Rollout.Diagram,
	"remediation": machinehealthcheck.Diagram,
}

func fsmCommand() *cobra.Command {
	var format, table string
	cmd := &cobra.Command{
		Use:   "fsm",
		Short: "Print a state machine: a Machine's lifecycle, a rollout's or a remediation's (mermaid or dot)",
		Long: `Print a state machine exactly as the controllers run it, as a Mermaid
state diagram or a Graphviz graph: the Machine lifecycle (--table machine),
a MachineDeployment's rollout (--table rollout) or a Machine's place on
its MachineHealthCheck's remediation ladder (--table remediation).`,
		Example: `  machinist fsm --format mermaid
  machinist fsm --table rollout --format dot | dot -Tsvg > rollout.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			diagram, ok := diagrams[table]
			if !ok {
				return fmt.Errorf("unknown table %q: use machine, rollout or remediation", table)
			}
			out, err := diagram(format)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "mermaid", "output format: mermaid or dot")
	cmd.Flags().StringVar(&table, "table", "machine", "which state machine: machine, rollout or remediation")
	return cmd
}
