package pki

import (
	"crypto/x509"
	"net"
	"strings"
	"testing"

	"k8s.io/client-go/util/cert"
)

func TestIssuedCertificatesVerifyAgainstTheirCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrNewCA(dir, "ca", "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrNewCA(dir, "ca", "other")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cert.Equal(ca.Cert) {
		t.Fatal("LoadOrNewCA made a new CA although one was stored")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	for _, tc := range []struct {
		req   Request
		usage x509.ExtKeyUsage
		name  string
	}{
		{Request{CommonName: "server", DNSNames: []string{"svc.ns.svc"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}}, x509.ExtKeyUsageServerAuth, "svc.ns.svc"},
		{Request{CommonName: "front-proxy-client", Client: true}, x509.ExtKeyUsageClientAuth, ""},
	} {
		pair, err := again.Issue(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		certs, err := cert.ParseCertsPEM(pair.CertPEM)
		if err != nil || len(certs) != 1 {
			t.Fatalf("%s: %v", tc.req.CommonName, err)
		}
		_, err = certs[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: tc.name, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
		if err != nil {
			t.Errorf("%s: %v", tc.req.CommonName, err)
		}
		if certs[0].Subject.CommonName != tc.req.CommonName {
			t.Errorf("subject %q, want %q", certs[0].Subject.CommonName, tc.req.CommonName)
		}
		// A client certificate must not serve, nor a serving one identify a client.
		other := x509.ExtKeyUsageClientAuth
		if tc.req.Client {
			other = x509.ExtKeyUsageServerAuth
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{other}}); err == nil {
			t.Errorf("%s verifies for the wrong usage", tc.req.CommonName)
		}
	}
}

// Two CAs made with the same name are still told apart by name: clients
// choose which certificate to offer by the issuer's name alone.
func TestCANamesAreUnique(t *testing.T) {
	a, err := NewCA("front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCA("front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, ca := range []*CA{a, b} {
		if !strings.HasPrefix(ca.Cert.Subject.CommonName, "front-proxy-ca@") {
			t.Errorf("CA named %q, want front-proxy-ca@<suffix>", ca.Cert.Subject.CommonName)
		}
	}
	if a.Cert.Subject.String() == b.Cert.Subject.String() {
		t.Errorf("two CAs share the name %q", a.Cert.Subject)
	}
}
