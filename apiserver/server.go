// Package apiserver is the aggregated verbs server: a small API server, built
// on k8s.io/apiserver, that serves the reboot and repair subresources of
// Machines in the group subresources.machinist.dev. kube-apiserver proxies
// requests to it through an APIService, after authenticating the caller;
// this server trusts the caller's identity only from the front proxy's
// client certificate, asks kube-apiserver (SubjectAccessReview) whether RBAC
// allows the verb, checks with the Machine state machine that the verb is
// allowed now, and records the request on the Machine. It never calls a
// provider: the Machine controller carries operations out.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/server/options"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/compatibility"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver/openapi"
	"github.com/machinist-dev/machinist/internal/pki"
)

// version is what the server reports at /version. It serves one API
// version and no Kubernetes features of its own, so it claims the
// Kubernetes version its libraries come from.
const version = "1.37"

// Options configure the verbs server.
type Options struct {
	// BindAddress and Port are where it listens (Port 0: any free port).
	BindAddress net.IP
	Port        int
	// CertDir holds its serving certificate: tls.crt and tls.key if given,
	// otherwise a generated CA (ca.crt, ca.key) and a certificate it signs
	// for Hosts, kept across restarts.
	CertDir string
	// Hosts are the names and addresses the generated serving certificate
	// answers to, such as the Service's <name>.<namespace>.svc.
	Hosts []string
	// Kubeconfig reaches kube-apiserver, for delegated authentication and
	// authorization and for reading and writing Machines. Empty means the
	// in-cluster configuration.
	Kubeconfig string
	// QPS and Burst bound its requests for Machines; zero means 200 and
	// 400, as k8s.io/apiserver's delegation clients use. Every verb costs a
	// read and a write.
	QPS   float32
	Burst int
}

// Server is a verbs server, ready to run.
type Server struct {
	generic *genericapiserver.GenericAPIServer
	// CABundle is the PEM of the CA that signed the serving certificate;
	// the APIService's caBundle.
	CABundle []byte
	// Port is the port it listens on.
	Port int
	// frontProxyCA is the CA kube-apiserver's aggregator signs its
	// client certificate with, as the server has loaded it so far.
	frontProxyCA func() []byte
}

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	if err := subresourcesv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	// The server registers no internal versions; these make the generic
	// machinery's own types (Status, options) encodable.
	unversioned := schema.GroupVersion{Version: "v1"}
	metav1.AddToGroupVersion(scheme, unversioned)
	scheme.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{},
		&metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
}

// New builds a verbs server from opts.
func New(opts Options) (*Server, error) {
	serving := options.NewSecureServingOptions()
	serving.BindAddress = opts.BindAddress
	if serving.BindAddress == nil {
		serving.BindAddress = net.ParseIP("127.0.0.1")
	}
	serving.BindPort = opts.Port
	// Many operations share one HTTP/2 connection from the aggregator.
	serving.HTTP2MaxStreamsPerConnection = 1000
	caBundle, err := servingCert(serving, opts)
	if err != nil {
		return nil, err
	}
	if opts.Port == 0 {
		// Listen now, so the caller learns the port before Run.
		ln, port, err := options.CreateListener("tcp", net.JoinHostPort(serving.BindAddress.String(), "0"), net.ListenConfig{})
		if err != nil {
			return nil, err
		}
		serving.Listener, serving.BindPort = ln, port
	}

	authn := options.NewDelegatingAuthenticationOptions()
	authn.RemoteKubeConfigFile = opts.Kubeconfig
	authz := options.NewDelegatingAuthorizationOptions()
	authz.RemoteKubeConfigFile = opts.Kubeconfig
	// kube-apiserver calls a conversion webhook without credentials: the
	// webhook converts what kube-apiserver already authorized.
	authz.AlwaysAllowPaths = append(authz.AlwaysAllowPaths, ConversionPath)

	cfg := genericapiserver.NewRecommendedConfig(codecs)
	if err := serving.ApplyTo(&cfg.SecureServing); err != nil {
		return nil, fmt.Errorf("serving: %w", err)
	}
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitions, openapinamer.NewDefinitionNamer(scheme))
	cfg.OpenAPIConfig.Info.Title, cfg.OpenAPIConfig.Info.Version = "Machinist verbs", subresourcesv1.SchemeGroupVersion.Version
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitions, openapinamer.NewDefinitionNamer(scheme))
	cfg.OpenAPIV3Config.Info.Title, cfg.OpenAPIV3Config.Info.Version = cfg.OpenAPIConfig.Info.Title, cfg.OpenAPIConfig.Info.Version
	if err := authn.ApplyTo(&cfg.Authentication, cfg.SecureServing, cfg.OpenAPIConfig); err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	// The delegating options always let anonymous requests through (their
	// Anonymous setting is not applied); only health checks may be.
	cfg.Authentication.Authenticator = identified{cfg.Authentication.Authenticator}
	if cfg.Authentication.RequestHeaderConfig == nil {
		return nil, fmt.Errorf("delegated authentication: kube-apiserver publishes no requestheader-client-ca-file in kube-system/extension-apiserver-authentication; it must run with --requestheader-client-ca-file for aggregated APIs to work")
	}
	frontProxyCA := cfg.Authentication.RequestHeaderConfig.CAContentProvider.CurrentCABundleContent
	// The front proxy's CA is read from a ConfigMap by an informer that
	// starts with the server: until it has synced, every request the
	// aggregator forwards fails authentication. Not ready until then, so
	// that a Service sends it nothing.
	cfg.AddReadyzChecks(healthz.NamedCheck("front-proxy-ca", func(*http.Request) error {
		if len(frontProxyCA()) == 0 {
			return errNoFrontProxyCA
		}
		return nil
	}))
	if err := authz.ApplyTo(&cfg.Authorization); err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	cfg.EffectiveVersion = compatibility.NewEffectiveVersionFromString(version, "", "")
	// The loopback client is for the server's own post-start hooks; it has
	// none that need kube-apiserver, and no flow control runs here.
	cfg.LoopbackClientConfig = &restclient.Config{}
	cfg.FlowControl = nil

	kube, err := kubeConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	kube.QPS, kube.Burst = 200, 400
	if opts.QPS > 0 {
		kube.QPS = opts.QPS
	}
	if opts.Burst > 0 {
		kube.Burst = opts.Burst
	}
	machines, err := newMachineClient(kube)
	if err != nil {
		return nil, err
	}

	generic, err := cfg.Complete().New("machinist-verbs", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(subresourcesv1.GroupName, scheme, metav1.ParameterCodec, codecs)
	group.VersionedResourcesStorageMap[subresourcesv1.SchemeGroupVersion.Version] = map[string]rest.Storage{
		subresourcesv1.Machines:                               &machineStorage{client: machines},
		subresourcesv1.Machines + "/" + subresourcesv1.Reboot: &verbStorage{client: machines, typ: machinistv1.OperationReboot},
		subresourcesv1.Machines + "/" + subresourcesv1.Repair: &verbStorage{client: machines, typ: machinistv1.OperationRepair},
	}
	if err := generic.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("installing %s: %w", subresourcesv1.GroupName, err)
	}
	generic.Handler.NonGoRestfulMux.Handle(ConversionPath, Conversion())
	return &Server{generic: generic, CABundle: caBundle, Port: serving.BindPort, frontProxyCA: frontProxyCA}, nil
}

var errNoFrontProxyCA = errors.New("the front proxy's CA (requestheader-client-ca-file) is not loaded yet")

// WaitReady waits until the running server can authenticate the requests
// kube-apiserver's aggregator forwards to it, the condition its readyz
// check reports.
func (s *Server) WaitReady(ctx context.Context, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return len(s.frontProxyCA()) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("the verbs server is not ready after %s: %w (%w)", timeout, errNoFrontProxyCA, err)
	}
	return nil
}

// Run serves until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	return s.generic.PrepareRun().RunWithContext(ctx)
}

// CABundle is the CA that a verbs server started with certDir (and no
// certificate of its own there) signs its serving certificate with: made
// at the first call, kept in certDir. Whoever must trust the server before
// it starts (a CRD's conversion webhook, installed with the CRD) reads it
// here.
func CABundle(certDir string) ([]byte, error) {
	ca, err := loadCA(certDir)
	if err != nil {
		return nil, err
	}
	return ca.CertPEM(), nil
}

func loadCA(certDir string) (*pki.CA, error) {
	ca, err := pki.LoadOrNewCA(certDir, "ca", "machinist-verbs-ca")
	if err != nil {
		return nil, fmt.Errorf("verbs server CA: %w", err)
	}
	return ca, nil
}

// servingCert points serving at tls.crt/tls.key in opts.CertDir, or
// generates a CA and a certificate it signs, and returns the CA bundle
// clients (the APIService) must trust.
func servingCert(serving *options.SecureServingOptions, opts Options) ([]byte, error) {
	if opts.CertDir == "" {
		return nil, fmt.Errorf("a certificate directory is required")
	}
	crt, key := filepath.Join(opts.CertDir, "tls.crt"), filepath.Join(opts.CertDir, "tls.key")
	serving.ServerCert.CertKey.CertFile, serving.ServerCert.CertKey.KeyFile = crt, key
	if given(crt) && given(key) && !given(filepath.Join(opts.CertDir, "ca.key")) {
		// Issued elsewhere (a Secret from cert-manager, say); ca.crt, if
		// there, is what the APIService must trust.
		bundle, err := os.ReadFile(filepath.Join(opts.CertDir, "ca.crt"))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		return bundle, nil
	}
	ca, err := loadCA(opts.CertDir)
	if err != nil {
		return nil, err
	}
	var dns []string
	var ips []net.IP
	for _, h := range append([]string{"localhost", "127.0.0.1"}, opts.Hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	pair, err := ca.Issue(pki.Request{CommonName: "machinist-verbs", DNSNames: dns, IPs: ips})
	if err != nil {
		return nil, err
	}
	// A fresh certificate every start: the hosts may have changed, and
	// the CA, which is what clients trust, stays.
	if err := pair.Write(opts.CertDir, "tls"); err != nil {
		return nil, err
	}
	return ca.CertPEM(), nil
}

func given(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func kubeConfig(path string) (*restclient.Config, error) {
	if path == "" {
		return restclient.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

func newMachineClient(cfg *restclient.Config) (client.Client, error) {
	s := runtime.NewScheme()
	if err := machinistv1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := authorizationv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}

// anonymousPaths are served to callers without an identity: the health
// checks, for kubelet probes, and the conversion webhook, which
// kube-apiserver calls without one.
var anonymousPaths = map[string]bool{"/healthz": true, "/livez": true, "/readyz": true, ConversionPath: true}

// identified refuses anonymous requests outside anonymousPaths, so that a
// request with forged X-Remote-User headers and no front-proxy certificate
// is 401 Unauthorized instead of an anonymous user that RBAC might allow.
type identified struct {
	authenticator.Request
}

// AuthenticateRequest implements authenticator.Request.
func (a identified) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	resp, ok, err := a.Request.AuthenticateRequest(req)
	if err != nil {
		return resp, ok, fmt.Errorf("%w (%s)", err, sender(req))
	}
	if ok && resp.User.GetName() == user.Anonymous && !anonymousPaths[req.URL.Path] {
		return nil, false, nil
	}
	return resp, ok, err
}

// sender says who sent a request that failed authentication: the log line
// kube-apiserver's libraries write for it names only the certificate's
// serial number, which does not tell an operator (or a test) whether the
// aggregator, a misconfigured client or a stranger on the port sent it.
func sender(req *http.Request) string {
	from := "from " + req.RemoteAddr
	if req.TLS == nil || len(req.TLS.PeerCertificates) == 0 {
		return from + ", without a client certificate"
	}
	c := req.TLS.PeerCertificates[0]
	return fmt.Sprintf("%s, client certificate %q issued by %q", from, c.Subject.String(), c.Issuer.String())
}
