package kubecontrollermanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/internal/pki"
)

// ClusterCA is the certificate authority of a cluster Machinist starts
// itself, as kubeadm's cluster CA is of a kubeadm cluster: kube-apiserver
// trusts it for client certificates, and kube-controller-manager signs the
// client certificates of joining kubelets with it. It lives in a
// directory as ca.crt and ca.key.
//
// It is also the apiserver's envtest.Authn, the one that gives envtest's
// users (the administrator, kube-controller-manager) their certificates.
// envtest's own (CertAuthn) keeps its CA's key in memory, where
// kube-controller-manager cannot sign with it, and writes the CA into
// --client-ca-file at a moment of its own choosing; trusting a second CA
// beside it would mean overwriting that file with a bundle behind
// envtest's back, or a flag it then overwrites. Being the Authn instead
// leaves one CA, written where we choose, that the signer and the
// apiserver agree on by construction; and a directory that is kept (a
// `machinist run` state directory) keeps the CA, so that the
// certificates machines were given stay valid across a restart.
type ClusterCA struct {
	ca  *pki.CA
	dir string
}

const caName = "ca"

// NewClusterCA loads the CA kept in dir, or makes one there.
func NewClusterCA(dir string) (*ClusterCA, error) {
	ca, err := pki.LoadOrNewCA(dir, caName, "machinist-cluster-ca")
	if err != nil {
		return nil, fmt.Errorf("controllermanager: the cluster CA in %s: %w", dir, err)
	}
	return &ClusterCA{ca: ca, dir: dir}, nil
}

// CertFile is the CA's certificate, PEM.
func (c *ClusterCA) CertFile() string { return filepath.Join(c.dir, caName+".crt") }

// KeyFile is the CA's private key, PEM, readable by its owner only.
func (c *ClusterCA) KeyFile() string { return filepath.Join(c.dir, caName+".key") }

// CertPEM is the CA's certificate: what verifies the client certificates
// it issued.
func (c *ClusterCA) CertPEM() []byte { return c.ca.CertPEM() }

// Configure makes kube-apiserver trust the CA for client certificates.
// It is part of envtest.Authn.
func (c *ClusterCA) Configure(_ string, args *envtest.Arguments) error {
	args.Set("client-ca-file", c.CertFile())
	return nil
}

// Start checks that the CA is still where kube-apiserver will read it.
// It is part of envtest.Authn.
func (c *ClusterCA) Start() error {
	if _, err := os.Stat(c.CertFile()); err != nil {
		return fmt.Errorf("controllermanager: the cluster CA: %w", err)
	}
	return nil
}

// AddUser returns base with a client certificate for user, signed by the
// CA. It is part of envtest.Authn.
func (c *ClusterCA) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	if user.Name == "" {
		return nil, errors.New("controllermanager: a user needs a name")
	}
	kp, err := c.ca.Issue(pki.Request{CommonName: user.Name, Groups: user.Groups, Client: true})
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData, cfg.KeyData = kp.CertPEM, kp.KeyPEM
	return cfg, nil
}

// Stop is part of envtest.Authn; the CA's files stay for the next start.
func (c *ClusterCA) Stop() error { return nil }

var _ envtest.Authn = (*ClusterCA)(nil)

// Joinable makes env's kube-apiserver, before it starts, one that
// machines join as kubelets do (with Start's signer beside it): ca
// authenticates client certificates; bootstrap tokens authenticate, so
// that a new machine can ask for its certificate; and a node is confined
// to its own Node, Lease and pods by the Node authorizer and the
// NodeRestriction admission plugin, RBAC answering for everyone else.
// The admission plugins enabled otherwise stay enabled.
func Joinable(env *envtest.Environment, ca *ClusterCA) {
	apiserver := env.ControlPlane.GetAPIServer()
	apiserver.SecureServing.Authn = ca
	args := apiserver.Configure()
	args.Set("enable-bootstrap-token-auth", "true")
	args.Set("authorization-mode", "Node,RBAC")
	args.Append("enable-admission-plugins", "NodeRestriction")
}
