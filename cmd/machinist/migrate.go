package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/internal/migration"
)

func migrateCommand() *cobra.Command {
	var (
		kubeconfig string
		byClient   bool
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Rewrite Machinist's stored objects at their storage version after an upgrade",
		Long: `Rewrites every stored object of each Machinist CRD whose status.storedVersions
lists another version than its storage version, then leaves storedVersions
listing the storage version alone. It asks for a StorageVersionMigration
(storagemigration.k8s.io/v1), which kube-controller-manager carries out;
where that API is not served, or with --by-client, it reads each object and
writes it back itself. Safe to run again: a CRD already migrated is left
alone, and each other one is migrated again from its start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cli.RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			ctx, cancel := cli.Deadline(cmd.Context(), timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			results, err := migration.Run(ctx, cfg, migration.Options{
				ByClient: byClient,
				Log:      func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) },
			})
			for _, r := range results {
				switch {
				case !r.Needed():
					fmt.Fprintf(out, "%s: stored as %s only, nothing to do\n", r.CRD, r.Storage)
				case r.Migration != "":
					fmt.Fprintf(out, "%s: migrated from [%s] by StorageVersionMigration %s\n", r.CRD, strings.Join(r.Before, " "), r.Migration)
				default:
					fmt.Fprintf(out, "%s: migrated from [%s], %d objects written back\n", r.CRD, strings.Join(r.Before, " "), r.Rewritten)
				}
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster; empty means in-cluster credentials")
	fs.BoolVar(&byClient, "by-client", false, "write the objects back with this command's own client instead of asking kube-controller-manager")
	fs.DurationVar(&timeout, "timeout", 30*time.Minute, "give up after this long; what was migrated stays migrated")
	return cmd
}
