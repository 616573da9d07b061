package kubecontrollermanager

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/internal/pki"
)

// KubeletClientUser is the user kube-apiserver is to kubelets: in
// system:masters, so that a kubelet's webhook authorization lets it read
// logs, exec and port-forward, as kubeadm's apiserver-kubelet-client is.
const KubeletClientUser = "kube-apiserver-kubelet-client"

// Serving makes apiserver serve with a certificate of ca for localhost and
// 127.0.0.1, written in dir (with the service account signing key, which
// envtest makes only along with its own serving certificate, kept there),
// instead of with envtest's CA, whose key envtest keeps to itself. It also
// authenticates kube-apiserver to kubelets with a client certificate of
// ca: a kubelet that trusts its join data's CA for client certificates,
// as kubeadm's kubelets trust their cluster's CA, then serves
// kube-apiserver its logs, exec and port-forward. ca is what the
// administrator's kubeconfig and every envtest user trust.
func Serving(apiserver *envtest.APIServer, ca *pki.CA, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cert, err := ca.Issue(pki.Request{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		return err
	}
	if err := cert.Write(dir, "apiserver"); err != nil {
		return err
	}
	if _, err := pki.LoadOrNewCA(dir, "sa-signer", "machinist-service-accounts"); err != nil {
		return fmt.Errorf("the service account signing key in %s: %w", dir, err)
	}
	client, err := ca.Issue(pki.Request{CommonName: KubeletClientUser, Groups: []string{"system:masters"}, Client: true})
	if err != nil {
		return err
	}
	if err := client.Write(dir, "kubelet-client"); err != nil {
		return err
	}
	apiserver.CertDir = dir
	apiserver.SecureServing.CA = ca.CertPEM()
	args := apiserver.Configure()
	args.Set("kubelet-client-certificate", filepath.Join(dir, "kubelet-client.crt"))
	args.Set("kubelet-client-key", filepath.Join(dir, "kubelet-client.key"))
	return nil
}
