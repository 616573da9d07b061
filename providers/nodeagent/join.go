package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// Credentials are a machine's own identity in its cluster: a client
// certificate for system:node:<name>, and where to use it.
type Credentials struct {
	// Server and CAData are the cluster's API server and the bundle that
	// verifies it, from the Join the credentials were got with.
	Server string
	CAData []byte
	// TLSServerName is the name Server's certificate is verified
	// against, when it is not Server's host.
	TLSServerName string
	// CertPEM and KeyPEM are the client certificate and its private key.
	CertPEM, KeyPEM []byte
}

// Config is a rest.Config that acts as the machine's Node.
func (c Credentials) Config() *rest.Config {
	return &rest.Config{
		Host:            c.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData, CertData: c.CertPEM, KeyData: c.KeyPEM, ServerName: c.TLSServerName},
	}
}

// Kubeconfig is the same as a kubeconfig file, as a kubelet keeps it.
func (c Credentials) Kubeconfig() ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CAData, TLSServerName: c.TLSServerName}
	cfg.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertPEM, ClientKeyData: c.KeyPEM}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "node"}
	cfg.CurrentContext = "node"
	return clientcmd.Write(*cfg)
}

// CredentialsFromKubeconfig reads what Kubeconfig wrote.
func CredentialsFromKubeconfig(data []byte) (Credentials, error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return Credentials{}, err
	}
	kctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return Credentials{}, fmt.Errorf("kubeconfig has no current context %q", cfg.CurrentContext)
	}
	cluster, auth := cfg.Clusters[kctx.Cluster], cfg.AuthInfos[kctx.AuthInfo]
	if cluster == nil || auth == nil || len(auth.ClientCertificateData) == 0 || len(auth.ClientKeyData) == 0 {
		return Credentials{}, errors.New("kubeconfig holds no client certificate and key")
	}
	return Credentials{Server: cluster.Server, CAData: cluster.CertificateAuthorityData, TLSServerName: cluster.TLSServerName,
		CertPEM: auth.ClientCertificateData, KeyPEM: auth.ClientKeyData}, nil
}

// Join gets the machine named nodeName its own credentials, as a kubelet's
// TLS bootstrap does: with j's bootstrap token it asks for a client
// certificate for system:node:<nodeName> through a CertificateSigningRequest
// (signer kubernetes.io/kube-apiserver-client-kubelet), which the cluster's
// kube-controller-manager approves and signs, and waits until it is issued
// or ctx ends. The private key never leaves this process. A failure is a
// *JoinError that says why; a request still waiting after
// CertificatePatience is told to progress (when not nil), and waited for
// still.
func Join(ctx context.Context, j bootstrap.Join, nodeName string, progress Progress) (Credentials, error) {
	if j.Server == "" || j.Token == "" {
		return Credentials{}, errors.New("nodeagent: joining needs a server and a bootstrap token")
	}
	cfg := &rest.Config{
		Host:            j.Server,
		BearerToken:     j.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: j.CAData, ServerName: j.TLSServerName},
		Timeout:         30 * time.Second,
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Credentials{}, err
	}
	req, err := RequestCertificate(ctx, kube, nodeName)
	if err != nil {
		if ctx.Err() != nil {
			return Credentials{}, err
		}
		return Credentials{}, explainRequest(j.Server, err)
	}
	for {
		wait, cancel := context.WithTimeout(ctx, CertificatePatience)
		cert, err := csr.WaitForCertificate(wait, kube, req.Name, req.UID)
		cancel()
		if err == nil {
			return Credentials{Server: j.Server, CAData: j.CAData, TLSServerName: j.TLSServerName, CertPEM: cert, KeyPEM: req.KeyPEM}, nil
		}
		if ctx.Err() != nil {
			return Credentials{}, fmt.Errorf("nodeagent: waiting for node %s's certificate (CertificateSigningRequest %s): %w", nodeName, req.Name, ctx.Err())
		}
		why := explainWait(ctx, kube, req.Name, CertificatePatience)
		if wait.Err() == nil || why.Reason == machinistv1.ReasonJoinCertificateDenied {
			// Denied, deleted or replaced: this request will never be
			// issued, and the caller asks anew.
			if why.Err == nil {
				why.Err = err
			}
			return Credentials{}, why
		}
		if progress != nil {
			progress(why)
		}
	}
}

// CertificateRequest is a node's CertificateSigningRequest for its client
// certificate, and the private key it was made with.
type CertificateRequest struct {
	// Name and UID are the CertificateSigningRequest's.
	Name string
	UID  types.UID
	// KeyPEM is the private key, PEM: a credential once the request is
	// issued.
	KeyPEM []byte
}

// RequestCertificate asks, through kube (a client of a bootstrap token),
// for a client certificate for system:node:<nodeName>, as a kubelet's TLS
// bootstrap does: a new key, and a CertificateSigningRequest of it for
// signer kubernetes.io/kube-apiserver-client-kubelet with the usages the
// approver allows a node. The key never leaves this process.
func RequestCertificate(ctx context.Context, kube kubernetes.Interface, nodeName string) (CertificateRequest, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CertificateRequest{}, err
	}
	req, err := certutil.MakeCSR(key, &pkix.Name{
		CommonName:   "system:node:" + nodeName,
		Organization: []string{"system:nodes"},
	}, nil, nil)
	if err != nil {
		return CertificateRequest{}, err
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	name, uid, err := csr.RequestCertificateWithContext(ctx, kube, req, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return CertificateRequest{}, fmt.Errorf("nodeagent: asking for node %s's certificate: %w", nodeName, err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return CertificateRequest{}, err
	}
	return CertificateRequest{Name: name, UID: uid,
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: keyutil.ECPrivateKeyBlockType, Bytes: der})}, nil
}
