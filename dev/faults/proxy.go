package faults

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/machinist-dev/machinist/internal/pki"
)

// Proxy serves a Transport over TLS and HTTP/2 in front of kube-apiserver.
// It forwards every request with its upstream's credentials, as `kubectl
// proxy` does, so it admits only clients holding a certificate of its own
// CA: the ones Config and Kubeconfig hand out. Impersonation headers pass
// through, so a client may still act as someone else where the upstream
// identity may impersonate.
type Proxy struct {
	// Transport injects the faults; Enable, Counts and Settle are on it.
	*Transport
	// URL is where the proxy listens.
	URL string

	upstream *rest.Config
	ca       *pki.CA
	client   *pki.KeyPair
	server   *http.Server
	done     chan error
}

// Start listens on addr ("127.0.0.1:0" picks a port) and forwards to the
// kube-apiserver upstream reaches, with the faults of c.
func Start(upstream *rest.Config, c Config, addr string) (*Proxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil || target.Host == "" {
		return nil, fmt.Errorf("upstream host %q is not a URL", upstream.Host)
	}
	next, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream transport: %w", err)
	}
	t, err := NewTransport(next, c)
	if err != nil {
		return nil, err
	}
	ca, err := pki.NewCA("machinist-fault-proxy-ca")
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	serving, err := ca.Issue(pki.Request{CommonName: "machinist-fault-proxy", DNSNames: []string{"localhost"}, IPs: servingIPs(host)})
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		return nil, err
	}
	clientPair, err := ca.Issue(pki.Request{CommonName: "machinist-fault-proxy-client", Client: true})
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)

	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
		},
		Transport: t,
		// Watches stream: pass every event on as it comes.
		FlushInterval: -1,
		// A stream broken on purpose is not news.
		ErrorLog: discardLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, ErrReplyLost) {
				// Break the stream (an HTTP/2 RST_STREAM): what a client
				// sees when a connection dies after the server acted.
				panic(http.ErrAbortHandler)
			}
			if r.Context().Err() != nil {
				return // the client went away
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		Transport: t,
		URL:       "https://" + ln.Addr().String(),
		upstream:  upstream, ca: ca, client: clientPair,
		done: make(chan error, 1),
	}
	p.server = &http.Server{
		Handler:           rp,
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
			MinVersion:   tls.VersionTLS12,
			NextProtos:   []string{"h2", "http/1.1"},
		},
		// client-go multiplexes every request and watch of a process over
		// one HTTP/2 connection; kube-apiserver allows 1000 streams on it.
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: 1000},
		ErrorLog: discardLog,
	}
	go func() { p.done <- p.server.ServeTLS(ln, "", "") }()
	return p, nil
}

func servingIPs(host string) []net.IP {
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	return ips
}

// Config reaches kube-apiserver through the proxy, with the upstream's
// rate limits and timeout.
func (p *Proxy) Config() *rest.Config {
	return &rest.Config{
		Host: p.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: p.ca.CertPEM(), CertData: p.client.CertPEM, KeyData: p.client.KeyPEM,
		},
		QPS: p.upstream.QPS, Burst: p.upstream.Burst, Timeout: p.upstream.Timeout,
		UserAgent: p.upstream.UserAgent,
	}
}

// Kubeconfig is a kubeconfig file's content that reaches kube-apiserver
// through the proxy.
func (p *Proxy) Kubeconfig() ([]byte, error) {
	c := clientcmdapi.NewConfig()
	c.Clusters["fault-proxy"] = &clientcmdapi.Cluster{Server: p.URL, CertificateAuthorityData: p.ca.CertPEM()}
	c.AuthInfos["fault-proxy"] = &clientcmdapi.AuthInfo{ClientCertificateData: p.client.CertPEM, ClientKeyData: p.client.KeyPEM}
	c.Contexts["fault-proxy"] = &clientcmdapi.Context{Cluster: "fault-proxy", AuthInfo: "fault-proxy"}
	c.CurrentContext = "fault-proxy"
	return clientcmd.Write(*c)
}

// Close stops listening, breaks every open stream, and waits for the
// requests a LateCommit rule holds back to be forwarded (at most a minute).
func (p *Proxy) Close() error {
	err := p.server.Close()
	if serr := <-p.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return errors.Join(err, p.Settle(ctx))
}

// discardLog silences net/http's own lines (TLS handshakes of clients
// that went away, streams broken on purpose).
var discardLog = log.New(io.Discard, "", 0)
