// Package pki makes the small certificate authorities Machinist needs when
// none is given: one that signs the verbs server's serving certificate
// (its public half is the APIService's caBundle) and, for a control plane
// Machinist runs itself, the front-proxy CA that kube-apiserver's
// aggregator proves its identity with.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// validity is how long generated certificates last. They are regenerated
// whenever they are missing, so a long life costs nothing.
const validity = 10 * 365 * 24 * time.Hour

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA named cn@<random>, as kube-apiserver names
// the CAs it makes for itself. No two CAs share a name: a TLS client offers
// its certificate only to a server that lists the certificate's issuer,
// by name, as one it accepts, so a client of another control plane on this
// host that reaches a port its own server once had offers none, instead
// of one that fails verification and is logged as an error.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: fmt.Sprintf("%s@%x", cn, suffix)}, key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: c, Key: key}, nil
}

// Request describes a certificate to issue.
type Request struct {
	// CommonName is the subject; for a client certificate it is the user.
	CommonName string
	// Groups, for a client certificate, are the user's groups: the
	// subject's organizations, as kube-apiserver reads them.
	Groups []string
	// DNSNames and IPs are the names a serving certificate answers to.
	DNSNames []string
	IPs      []net.IP
	// Client makes a client certificate; otherwise it is a serving one.
	Client bool
}

// KeyPair is an issued certificate and its private key, PEM-encoded.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a new certificate for req.
func (ca *CA) Issue(req Request) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Groups},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if req.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", req.CommonName, err)
	}
	issued, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	certPEM, err := cert.EncodeCertificates(issued)
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// CertPEM is the CA's certificate, PEM-encoded: what clients trust.
func (ca *CA) CertPEM() []byte {
	out, err := cert.EncodeCertificates(ca.Cert)
	if err != nil {
		// Encoding a certificate this package parsed cannot fail.
		panic(err)
	}
	return out
}

// Write stores the CA as <dir>/<name>.crt and <dir>/<name>.key.
func (ca *CA) Write(dir, name string) error {
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(ca.Key)
	if err != nil {
		return err
	}
	return (&KeyPair{CertPEM: ca.CertPEM(), KeyPEM: keyPEM}).Write(dir, name)
}

// LoadCA reads a CA that Write stored.
func LoadCA(dir, name string) (*CA, error) {
	certs, err := cert.CertsFromFile(filepath.Join(dir, name+".crt"))
	if err != nil {
		return nil, err
	}
	key, err := keyutil.PrivateKeyFromFile(filepath.Join(dir, name+".key"))
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok || len(certs) == 0 {
		return nil, fmt.Errorf("%s: not a CA certificate and signing key", filepath.Join(dir, name))
	}
	return &CA{Cert: certs[0], Key: signer}, nil
}

// LoadOrNewCA reads the CA stored under dir/name, or makes and stores one.
func LoadOrNewCA(dir, name, cn string) (*CA, error) {
	ca, err := LoadCA(dir, name)
	if err == nil {
		return ca, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if ca, err = NewCA(cn); err != nil {
		return nil, err
	}
	return ca, ca.Write(dir, name)
}

// Write stores the pair as <dir>/<name>.crt and <dir>/<name>.key; the key
// is readable by its owner only.
func (kp *KeyPair) Write(dir, name string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), kp.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), kp.KeyPEM, 0o600)
}

// FrontProxy makes, in dir, a front-proxy CA and the client certificate
// kube-apiserver's aggregator presents to the servers it proxies, and
// returns the kube-apiserver flags that use them. An existing CA in dir is
// kept, so a restarted control plane's verbs server keeps trusting it.
func FrontProxy(dir string) (map[string]string, error) {
	ca, err := LoadOrNewCA(dir, "ca", "front-proxy-ca")
	if err != nil {
		return nil, err
	}
	client, err := ca.Issue(Request{CommonName: "front-proxy-client", Client: true})
	if err != nil {
		return nil, err
	}
	if err := client.Write(dir, "client"); err != nil {
		return nil, err
	}
	return map[string]string{
		"requestheader-client-ca-file":       filepath.Join(dir, "ca.crt"),
		"requestheader-allowed-names":        "front-proxy-client",
		"requestheader-username-headers":     "X-Remote-User",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"proxy-client-cert-file":             filepath.Join(dir, "client.crt"),
		"proxy-client-key-file":              filepath.Join(dir, "client.key"),
	}, nil
}
