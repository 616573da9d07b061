package testenv

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/internal/pki"
)

// conversion serves the CRDs' conversion webhook for a test control plane,
// from the test process: the handler the verbs server serves, behind a
// certificate from the same CA code, on a port of its own, so that tests
// may stop and start verbs servers without taking conversion away.
type conversion struct {
	url      string
	caBundle []byte

	mu     sync.Mutex
	ln     net.Listener
	server *http.Server
	cert   tls.Certificate
	port   int
}

func startConversion() (*conversion, error) {
	ca, err := pki.NewCA("machinist-test-conversion-ca")
	if err != nil {
		return nil, err
	}
	pair, err := ca.Issue(pki.Request{CommonName: "localhost", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	c := &conversion{
		url:      fmt.Sprintf("https://127.0.0.1:%d%s", port, apiserver.ConversionPath),
		caBundle: ca.CertPEM(), cert: cert, port: port,
	}
	c.serve(ln)
	return c, nil
}

func (c *conversion) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle(apiserver.ConversionPath, apiserver.Conversion())
	c.ln = ln
	c.server = &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{c.cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = c.server.ServeTLS(ln, "", "") }()
}

// stop closes the webhook's listener and connections: conversions fail
// until start.
func (c *conversion) stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server == nil {
		return nil
	}
	err := c.server.Close()
	c.server = nil
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// start serves the webhook again, on its port.
func (c *conversion) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server != nil {
		return nil
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", c.port))
	if err != nil {
		return err
	}
	c.serve(ln)
	return nil
}

// StopConversion stops the CRDs' conversion webhook, as when the verbs
// server that serves it in a cluster is down; StartConversion serves it
// again.
func (e *Env) StopConversion() error {
	if e.conversion == nil {
		return errors.New("this control plane has no conversion webhook (a workload cluster)")
	}
	return e.conversion.stop()
}

// StartConversion serves the conversion webhook StopConversion stopped.
func (e *Env) StartConversion() error {
	if e.conversion == nil {
		return errors.New("this control plane has no conversion webhook (a workload cluster)")
	}
	return e.conversion.start()
}
