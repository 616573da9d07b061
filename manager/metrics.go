package manager

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"

	certutil "k8s.io/client-go/util/cert"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// metricsServing is how addr ("0": nowhere) serves /metrics: plain HTTP
// to anyone, or, with opts.MetricsSecure, HTTPS to the scrapers
// kube-apiserver vouches for and allows get on /metrics.
func metricsServing(opts Options, addr string) (metricsserver.Options, error) {
	served := metricsserver.Options{BindAddress: addr}
	if addr == "0" {
		return served, nil
	}
	if !opts.MetricsSecure {
		if !loopback(addr) {
			ctrl.Log.WithName("manager").Info("serving /metrics over plain HTTP, without authentication, to whoever reaches it; --metrics-secure serves HTTPS to scrapers allowed get on /metrics",
				"address", addr)
		}
		return served, nil
	}
	served.SecureServing = true
	served.FilterProvider = scrapers
	// A scrape needs nothing of HTTP/2, and its stream-level attacks (rapid
	// reset) would reach the server before authentication turns a stranger
	// away.
	served.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	if opts.MetricsCertDir == "" {
		// controller-runtime would first look for a certificate in a fixed
		// directory under $TMPDIR, which any user of a shared host can
		// write: made here, empty means self-signed and nothing else.
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
		if err != nil {
			return served, fmt.Errorf("making the metrics server's self-signed certificate: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return served, fmt.Errorf("making the metrics server's self-signed certificate: %w", err)
		}
		served.TLSOpts = append(served.TLSOpts, func(c *tls.Config) {
			c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
		})
		return served, nil
	}
	// controller-runtime falls back to a self-signed certificate when the
	// files are missing: a scraper that verifies would then fail with no
	// word of why, so a directory given without them is an error.
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(opts.MetricsCertDir, name)); err != nil {
			return served, fmt.Errorf("the metrics server's certificate directory: %w", err)
		}
	}
	served.CertDir = opts.MetricsCertDir
	return served, nil
}

// loopback says whether addr listens on a loopback address only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
