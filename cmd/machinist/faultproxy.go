package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/dev/faults"
)

func faultProxyCommand() *cobra.Command {
	var (
		kubeconfig, listen, rules, out, metrics string
		seed                                    uint64
		logs                                    cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "fault-proxy",
		Short: "Put faults between clients and kube-apiserver on purpose: lost replies, late commits, 503s, 429s, latency, cut watches",
		Long: `Serve kube-apiserver, reached with --kubeconfig, over TLS and HTTP/2 on
--listen, striking the requests that the rules in --rules match: a reply
lost after the write was stored, a 504 answered at once and the request
stored later, a 503 or a 429 before anything is stored, added latency, a
lagging or cut watch. Every decision comes from one generator seeded by
--seed (or the file's seed), so a run's faults can be had again.

The proxy forwards with the credentials of --kubeconfig and admits only
clients with a certificate of its own CA: point a manager, kubectl or any
client at the kubeconfig it writes to --write-kubeconfig. Each fault is
logged as it strikes; the counts per rule are served as Prometheus
metrics on --metrics-bind-address and printed when the proxy stops.`,
		Example: `  machinist fault-proxy --kubeconfig ~/.kube/config --rules faults.yaml \
    --write-kubeconfig /tmp/faulty.kubeconfig
  machinist manager --kubeconfig /tmp/faulty.kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.SetUp(); err != nil {
				return err
			}
			if rules == "" || out == "" {
				return errors.New("--rules and --write-kubeconfig are required")
			}
			config, err := faults.Load(rules)
			if err != nil {
				return err
			}
			if seed != 0 {
				config.Seed = seed
			}
			cfg, err := cli.RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			p, err := faults.Start(cfg, config, listen)
			if err != nil {
				return err
			}
			log := ctrl.Log.WithName("fault-proxy")
			struck := prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "machinist_fault_proxy_struck_total", Help: "Requests the fault proxy struck, by rule and fault.",
			}, []string{"rule", "fault"})
			p.OnStrike = func(s faults.Strike) {
				struck.WithLabelValues(s.Rule, string(s.Fault)).Inc()
				log.Info("struck", "rule", s.Rule, "fault", s.Fault, "verb", s.Verb, "resource", s.Resource, "namespace", s.Namespace, "name", s.Name)
			}
			raw, err := p.Kubeconfig()
			if err != nil {
				return errors.Join(err, p.Close())
			}
			if err := os.WriteFile(out, raw, 0o600); err != nil {
				return errors.Join(err, p.Close())
			}
			if metrics != "" && metrics != "0" {
				reg := prometheus.NewRegistry()
				reg.MustRegister(struck)
				srv := &http.Server{Addr: metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
				go func() {
					if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
						log.Error(err, "serving metrics")
					}
				}()
				defer srv.Close()
			}
			log.Info("serving", "url", p.URL, "upstream", cfg.Host, "rules", len(config.Rules), "seed", config.Seed, "kubeconfig", out)
			<-ctrl.SetupSignalHandler().Done()
			err = p.Close()
			for _, c := range p.Counts() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s (%s): %d\n", c.Rule, c.Fault, c.Struck)
			}
			stored, refused := p.Late()
			fmt.Fprintf(cmd.OutOrStdout(), "late commits stored: %d, refused: %d\n", stored, refused)
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the kube-apiserver to stand in front of; empty means in-cluster credentials")
	fs.StringVar(&listen, "listen", "127.0.0.1:6444", "address to serve on (port 0 picks one)")
	fs.StringVar(&rules, "rules", "", "YAML file of the seed and rules (see docs/reliability.md)")
	fs.Uint64Var(&seed, "seed", 0, "seed of the faults' generator; 0 keeps the file's")
	fs.StringVar(&out, "write-kubeconfig", "", "where to write the kubeconfig that reaches kube-apiserver through the proxy")
	fs.StringVar(&metrics, "metrics-bind-address", "0", "address to serve the counts as Prometheus metrics on, over plain HTTP to anyone who reaches it (keep it on loopback); 0 serves none")
	logs.Add(fs)
	return cmd
}
