// Package plugin carries the Actuator contract over gRPC, so that a
// provider can run in a process of its own: Serve offers any
// providers.Actuator on an endpoint, and Dial returns an Actuator that
// calls one. The protocol is defined in proto/machinist/provider/v1 beside
// this package, and described, with its error contract, in
// docs/providers.md.
package plugin

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Endpoint is where a provider listens: a Unix socket (unix:///path, for
// a sidecar beside the manager) or a TCP address (tcp://host:port, for a
// provider running as its own Deployment, always with mutual TLS).
type Endpoint struct {
	// Network is "unix" or "tcp".
	Network string
	// Address is the socket's path or host:port.
	Address string
}

// ParseEndpoint reads unix:///abs/path, unix://relative/path or
// tcp://host:port.
func ParseEndpoint(s string) (Endpoint, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || rest == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: want unix:///path/to.sock or tcp://host:port", s)
	}
	switch scheme {
	case "unix":
		return Endpoint{Network: "unix", Address: filepath.Clean(rest)}, nil
	case "tcp":
		if _, _, err := net.SplitHostPort(rest); err != nil {
			return Endpoint{}, fmt.Errorf("endpoint %q: %w", s, err)
		}
		return Endpoint{Network: "tcp", Address: rest}, nil
	default:
		return Endpoint{}, fmt.Errorf("endpoint %q: scheme %q is neither unix nor tcp", s, scheme)
	}
}

// String is the endpoint as ParseEndpoint reads it.
func (e Endpoint) String() string {
	if e.Network == "unix" && !filepath.IsAbs(e.Address) {
		return "unix://" + e.Address
	}
	return e.Network + "://" + e.Address
}

// target is the endpoint in gRPC's naming.
func (e Endpoint) target() string {
	if e.Network == "unix" {
		abs, err := filepath.Abs(e.Address)
		if err == nil {
			return "unix://" + abs
		}
		return "unix:" + e.Address
	}
	return "dns:///" + e.Address
}

// TLSFiles name the PEM files for mutual TLS: the CA that signed the other
// side's certificate, and this side's certificate and key.
type TLSFiles struct {
	CA   string
	Cert string
	Key  string
}

// Empty reports whether no file is named.
func (f TLSFiles) Empty() bool { return f == TLSFiles{} }

func (f TLSFiles) load() (*x509.CertPool, tls.Certificate, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, tls.Certificate{}, errors.New("mutual TLS needs a CA, a certificate and a key")
	}
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, tls.Certificate{}, fmt.Errorf("%s holds no PEM certificate", f.CA)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pool, pair, nil
}

// serverConfig asks every client for a certificate signed by the CA.
func (f TLSFiles) serverConfig() (*tls.Config, error) {
	pool, pair, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// clientConfig trusts only servers whose certificate the CA signed for
// the endpoint's host.
func (f TLSFiles) clientConfig(e Endpoint) (*tls.Config, error) {
	pool, pair, err := f.load()
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(e.Address)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ServerName:   host,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// checkTransport refuses TCP without mutual TLS: anyone who reaches the
// port could otherwise create and delete machines.
func checkTransport(e Endpoint, files TLSFiles) error {
	if e.Network == "tcp" && files.Empty() {
		return fmt.Errorf("endpoint %s is TCP and needs mutual TLS: give a CA, a certificate and a key", e)
	}
	return nil
}
