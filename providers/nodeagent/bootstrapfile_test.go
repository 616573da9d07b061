package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/internal/bootstrap"
)

func TestBootstrapKubeconfigRoundTrip(t *testing.T) {
	j := bootstrap.Join{Server: "https://cluster.example:6443", CAData: []byte("ca"), Token: "abcdef.0123456789abcdef"}
	data, err := BootstrapKubeconfig(j)
	if err != nil {
		t.Fatal(err)
	}
	got, err := JoinFromBootstrapKubeconfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Server != j.Server || string(got.CAData) != "ca" || got.Token != j.Token {
		t.Fatalf("read back %v (CA %q), want %v", got, got.CAData, j)
	}
	if _, err := JoinFromBootstrapKubeconfig([]byte("apiVersion: v1\nkind: Config\n")); err == nil {
		t.Fatal("a kubeconfig without a token read as join data")
	}
}

// nodeCredentials are credentials with a self-signed certificate for cn,
// valid until notAfter.
func nodeCredentials(t *testing.T, cn string, notAfter time.Time) Credentials {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Credentials{Server: "https://cluster.example:6443",
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}
}

func TestBootstrapKeepsValidCredentialsAndJoinsAgainOtherwise(t *testing.T) {
	for _, c := range []struct {
		name  string
		creds Credentials
		kept  bool
	}{
		{"valid", nodeCredentials(t, "system:node:n1", time.Now().Add(time.Hour)), true},
		{"another node's", nodeCredentials(t, "system:node:n2", time.Now().Add(time.Hour)), false},
		{"expired", nodeCredentials(t, "system:node:n1", time.Now().Add(-time.Minute)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			kubeconfig := filepath.Join(dir, "kubeconfig")
			data, err := c.creds.Kubeconfig()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
				t.Fatal(err)
			}
			// No join data: credentials that will not do cannot be
			// replaced, which shows as an error naming it.
			got, err := Bootstrap(context.Background(), filepath.Join(dir, "bootstrap-kubeconfig"), kubeconfig, "n1", "test:///n1", nil)
			if c.kept {
				if err != nil || string(got.CertPEM) != string(c.creds.CertPEM) {
					t.Fatalf("Bootstrap = %v, want the kept credentials", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "no join data") {
				t.Fatalf("Bootstrap = %v, want it to join again (and find no join data)", err)
			}
		})
	}
}

func TestWritePrivateIsOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bootstrap-kubeconfig")
	if err := WriteBootstrapKubeconfig(path, bootstrap.Join{Server: "https://x", Token: "abcdef.0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
}
