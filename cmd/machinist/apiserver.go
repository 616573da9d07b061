package main

import (
	"net"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/cmd/internal/cli"
)

func apiserverCommand() *cobra.Command {
	var (
		opts       apiserver.Options
		bind       string
		apiService string
		service    string
		logs       cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "apiserver",
		Short: "Run the aggregated verbs server (machines/reboot, machines/repair)",
		Long: `Run the verbs server that kube-apiserver proxies the group
subresources.machinist.dev to. It trusts the caller's identity only from
kube-apiserver's front proxy, asks kube-apiserver whether RBAC allows the
verb, and records accepted verbs on the Machine.

It also serves the CRDs' conversion webhook (` + "`/convert`" + `), which kube-apiserver
calls to convert Machinist's objects between v1alpha1 and v1beta1.

With an empty --cert-dir it makes a CA and a serving certificate for
localhost and the Service's names; with --apiservice it then writes that
CA into the APIService's caBundle and into the conversion webhook of each
of Machinist's CRDs, so no other certificate tooling is needed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.SetUp(); err != nil {
				return err
			}
			opts.BindAddress = net.ParseIP(bind)
			opts.Hosts = apiserver.ServiceHostsOf(service)
			srv, err := apiserver.New(opts)
			if err != nil {
				return err
			}
			ctx := ctrl.SetupSignalHandler()
			if apiService != "" {
				cfg, err := cli.RestConfig(opts.Kubeconfig)
				if err != nil {
					return err
				}
				s := runtime.NewScheme()
				if err := apiregv1.AddToScheme(s); err != nil {
					return err
				}
				if err := apiextensionsv1.AddToScheme(s); err != nil {
					return err
				}
				c, err := client.New(cfg, client.Options{Scheme: s})
				if err != nil {
					return err
				}
				if err := apiserver.SetCABundle(ctx, c, apiService, srv.CABundle); err != nil {
					return err
				}
				if err := apiserver.SetConversionCABundle(ctx, c, srv.CABundle); err != nil {
					return err
				}
			}
			return srv.Run(ctx)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster; empty means in-cluster credentials")
	fs.StringVar(&bind, "bind-address", "0.0.0.0", "address to listen on")
	fs.IntVar(&opts.Port, "secure-port", 8443, "HTTPS port")
	fs.StringVar(&opts.CertDir, "cert-dir", "/var/run/machinist/certs", "tls.crt and tls.key to serve with, or where to keep a generated CA and certificate")
	fs.StringVar(&service, "service", "machinist-system/machinist-verbs", "namespace/name of the Service in front of this server, for the generated certificate")
	fs.StringVar(&apiService, "apiservice", "", "APIService whose caBundle, and the CRDs' conversion webhooks', to set to the generated CA at start (e.g. "+apiserver.APIServiceName+")")
	fs.Float32Var(&opts.QPS, "kube-api-qps", 200, "requests per second to the API server")
	fs.IntVar(&opts.Burst, "kube-api-burst", 400, "burst of requests to the API server")
	logs.Add(fs)
	return cmd
}
