package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/machinist-dev/machinist/lifecycle"
)

func fsmCommand() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "fsm",
		Short: "Print the Machine state machine (mermaid or dot)",
		Long: `Print the Machine state machine exactly as the controller runs it,
as a Mermaid state diagram or a Graphviz graph.`,
		Example: `  machinist fsm --format mermaid
  machinist fsm --format dot | dot -Tsvg > lifecycle.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := lifecycle.Diagram(format)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "mermaid", "output format: mermaid or dot")
	return cmd
}
