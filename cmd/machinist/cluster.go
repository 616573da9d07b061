package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/cmd/internal/cli"
)

func clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Make a cluster ready for Machinist's machines to join",
	}
	cmd.AddCommand(prepareCommand())
	return cmd
}

func prepareCommand() *cobra.Command {
	var (
		dryRun  bool
		wait    time.Duration
		timeout time.Duration
	)
	flags := genericclioptions.NewConfigFlags(false)
	cmd := &cobra.Command{
		Use:   "prepare",
		Short: "Install the RBAC machines join with, and check the rest of what joining needs",
		Long: `Prepares the cluster of the current kubeconfig context for Machinist's
machines to join it as kubelets do, with a bootstrap token: a workload
cluster, or a management cluster whose own Nodes Machines become.

It applies the join RBAC (the ClusterRole and ClusterRoleBindings of
config/join), creating what is missing and leaving what is right alone,
so it is safe to run again. Then it checks, by trying each, what else a
join relies on: that kube-apiserver accepts bootstrap tokens, that the
join bindings are in force, that it authorizes nodes with the Node
authorizer, that kube-controller-manager approves and signs a node's
certificate request, that NodeRestriction confines a node to its own
Node, and that the token cleaner deletes expired tokens. To check, it
makes a bootstrap token (for ten minutes at most), a certificate request
and an expired token, and deletes them.

Each check that fails is printed with the kube-apiserver or
kube-controller-manager flag that fixes it, and the command exits 1.

With --dry-run, the RBAC is only checked by the server, not kept, and the
checks report the cluster as it is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.ToRESTConfig()
			if err != nil {
				return err
			}
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, cancel := cli.Deadline(cmd.Context(), timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			changes, err := joinable.Install(ctx, kube, dryRun)
			suffix := ""
			if dryRun {
				suffix = " (server dry run)"
			}
			for _, c := range changes {
				fmt.Fprintln(out, c.String()+suffix)
			}
			if err != nil {
				return fmt.Errorf("installing the join RBAC: %w", err)
			}
			report, err := joinable.Check(ctx, cfg, joinable.Options{Wait: wait})
			if err != nil {
				return err
			}
			fmt.Fprintln(out)
			printReport(out, report)
			if !report.Joinable() {
				return fmt.Errorf("machines cannot join this cluster yet: %d of %d checks failed", len(report.Failures()), len(report))
			}
			return nil
		},
	}
	flags.AddFlags(cmd.Flags())
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "Have the server check the RBAC's writes without keeping them")
	cmd.Flags().DurationVar(&wait, "wait", joinable.DefaultWait, "How long kube-controller-manager is given to approve and sign a certificate request, and to delete an expired token")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "How long the whole command may take")
	return cmd
}

// printReport writes one line per check, and below, for those that
// failed, what fixes them.
func printReport(out io.Writer, r joinable.Report) {
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
	for _, f := range r {
		detail := f.Detail
		if f.Said != "" {
			// The cluster's words, for whoever administers it: on one
			// line, so that the table stays one.
			detail += " (the cluster said: " + strings.Join(strings.Fields(f.Said), " ") + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", f.Check, f.Result, detail)
	}
	_ = w.Flush()
	failures := r.Failures()
	if len(failures) == 0 {
		return
	}
	fmt.Fprintln(out, "\nTo fix:")
	for _, f := range failures {
		if f.Fix != "" {
			fmt.Fprintf(out, "  %s (%s): %s\n", f.Check, f.Reason, f.Fix)
		}
	}
}
