package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/plugin/conformance"
)

func providerConformanceCommand() *cobra.Command {
	var (
		cfg           conformance.Config
		kubeconfig    string
		providerSpec  string
		transientSpec string
		providerLog   string
	)
	cmd := &cobra.Command{
		Use:   "conformance --endpoint unix:///path/to.sock --kubeconfig FILE",
		Short: "Check a provider against the provider protocol's contract",
		Long: `Check the provider at --endpoint against the contract the Machine controller
relies on: Create idempotent on the Machine's UID, even under concurrent
calls; reboot, repair and update carried out once per operation ID;
Delete idempotent; undeclared verbs and invalid requests refused; errors
permanent only when retrying cannot help.

The checks create, restart and delete real instances, and judge them by
the Nodes they register in the cluster --kubeconfig reaches: the
provider must be serving that cluster. The Machines and the MachineClass
are fabricated; none is written to the cluster. Each check deletes what
it made, and its Nodes and Leases, so the credentials must be allowed to
list, watch and delete Nodes and delete Leases in kube-node-lease.

Every Create and repair carries join data of its own: the API server of
--kubeconfig (or --join-server) and a bootstrap token the suite makes in
kube-system for that call, deleted when its check ends. A check proves
that the machine joined with it, by the CertificateSigningRequest its
token asked for. So the credentials must also be allowed to create and
delete Secrets in kube-system and list CertificateSigningRequests, and
the cluster must approve and sign kubelet client certificates for
bootstrap tokens. With --provider-log, a last check searches the
provider's log for every token's secret.

One line is printed per check. The exit status is 1 unless every check
passed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rc, err := cli.RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			if cfg.Kube, err = kubernetes.NewForConfig(rc); err != nil {
				return err
			}
			if cfg.Server == "" {
				cfg.Server = rc.Host
			}
			cfg.CAData = rc.CAData
			if len(cfg.CAData) == 0 && rc.CAFile != "" {
				if cfg.CAData, err = os.ReadFile(rc.CAFile); err != nil {
					return fmt.Errorf("the kubeconfig's certificate authority: %w", err)
				}
			}
			if providerLog != "" {
				cfg.Logs = func() ([]byte, error) { return os.ReadFile(providerLog) }
			}
			if providerSpec != "" {
				cfg.ProviderSpec = []byte(providerSpec)
			}
			if transientSpec != "" {
				cfg.TransientProviderSpec = []byte(transientSpec)
			}
			// Interrupted, the suite still deletes what the check under
			// way made; restoring the default once the first signal is in
			// lets a second one kill it.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				<-ctx.Done()
				stop()
			}()
			out := cmd.OutOrStdout()
			results, err := conformance.Run(ctx, cfg, func(r conformance.Result) {
				if r.Err != nil {
					fmt.Fprintf(out, "FAIL  %s: %s\n", r.Name, oneLine(r.Err))
					return
				}
				fmt.Fprintf(out, "PASS  %s (%.1fs)\n", r.Name, r.Duration.Seconds())
			})
			if err != nil {
				return err
			}
			failed := 0
			for _, r := range results {
				if r.Err != nil {
					failed++
				}
			}
			fmt.Fprintf(out, "%d checks: %d passed, %d failed\n", len(results), len(results)-failed, failed)
			if failed > 0 {
				return fmt.Errorf("the provider at %s failed %d of %d conformance checks", cfg.Endpoint, failed, len(results))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "the provider's endpoint: unix:///path/to.sock, or tcp://host:port with --tls-*")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster the provider registers its Nodes with")
	cli.AddClientTLSFlags(fs, "", &cfg.TLS)
	fs.StringVar(&providerSpec, "provider-spec", "", "the MachineClass providerSpec the instances are made with, as JSON")
	fs.StringVar(&transientSpec, "transient-provider-spec", "", "a providerSpec, as JSON, with which Create fails transiently; given, a check proves the failure is not reported as permanent")
	fs.StringVar(&cfg.Namespace, "namespace", "", "the namespace written into the fabricated Machines (default conformance)")
	fs.StringVar(&cfg.Version, "version", "", "the Machines' spec.version (default v1.37.2)")
	fs.StringVar(&cfg.UpdateVersion, "update-version", "", "the version the in-place update check updates to (default v1.38.0)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "how long a call may take and a Node may take to show its effect (0: 90s)")
	fs.DurationVar(&cfg.Settle, "settle", 0, "how long to watch that a repeated call has no second effect (0: 5s)")
	fs.StringVar(&cfg.Server, "join-server", "", "the API server's URL as the machines reach it, for their join data (default: the kubeconfig's)")
	fs.StringSliceVar(&cfg.TokenGroups, "token-groups", nil, "groups for the bootstrap tokens the suite makes, in place of "+bootstrap.NodeGroup+" (which clusters Machinist set up let join); for a cluster bootstrapped otherwise, such as kubeadm's system:bootstrappers:kubeadm:default-node-token")
	fs.StringVar(&providerLog, "provider-log", "", "a file the provider logs to; given, a check proves no bootstrap token shows in it")
	_ = cmd.MarkFlagRequired("endpoint")
	_ = cmd.MarkFlagRequired("kubeconfig")
	return cmd
}

// oneLine keeps a check's error on its line: a joined error has several.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
