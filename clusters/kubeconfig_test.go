package clusters

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfig is a valid kubeconfig of inline data, changed by edit.
func kubeconfig(t testing.TB, edit func(*clientcmdapi.Config, *clientcmdapi.Cluster, *clientcmdapi.AuthInfo)) []byte {
	t.Helper()
	cluster := &clientcmdapi.Cluster{Server: "https://workload.example:6443", CertificateAuthorityData: []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")}
	user := &clientcmdapi.AuthInfo{Token: "inline"}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"], cfg.AuthInfos["u"] = cluster, user
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	if edit != nil {
		edit(cfg, cluster, user)
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRESTConfigTakesInlineDataOnly(t *testing.T) {
	exec := &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/true", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
	cases := []struct {
		name  string
		edit  func(*clientcmdapi.Config, *clientcmdapi.Cluster, *clientcmdapi.AuthInfo)
		trust Trust
		// refused is the field a RefusedError names; invalid is a part of
		// any other error; both empty: accepted.
		refused, invalid string
	}{
		{name: "inline data"},
		{name: "Cluster API's shape: client certificate data", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.ClientCertificateData, u.ClientKeyData = "", []byte("cert"), []byte("key")
		}},
		{name: "basic auth and impersonation", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.Username, u.Password, u.Impersonate = "", "a", "b", "someone"
		}},
		{name: "a proxy", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.ProxyURL = "socks5://proxy.example:1080"
		}},
		{name: "a proxy that is not one", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.ProxyURL = "file:///etc/passwd"
		}, invalid: "proxy-url"},
		{name: "exec", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) { u.Exec = exec },
			refused: "users[u].user.exec"},
		{name: "exec, allowed", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) { u.Exec = exec },
			trust: Trust{Exec: true}},
		{name: "auth-provider, even with exec allowed", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}, trust: Trust{Exec: true, InsecureTLS: true}, refused: "users[u].user.auth-provider"},
		{name: "tokenFile, whatever is trusted", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.TokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
		}, trust: Trust{Exec: true, InsecureTLS: true}, refused: "users[u].user.tokenFile"},
		{name: "client-certificate", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.ClientCertificate = "/etc/kubernetes/pki/apiserver.crt"
		}, refused: "users[u].user.client-certificate"},
		{name: "client-key", edit: func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.ClientKey = "/etc/kubernetes/pki/apiserver.key"
		}, refused: "users[u].user.client-key"},
		{name: "certificate-authority", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthority = "/etc/kubernetes/pki/ca.crt"
		}, trust: Trust{InsecureTLS: true}, refused: "clusters[c].cluster.certificate-authority"},
		{name: "insecure-skip-tls-verify", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData, c.InsecureSkipTLSVerify = nil, true
		}, refused: "clusters[c].cluster.insecure-skip-tls-verify"},
		{name: "insecure-skip-tls-verify, allowed", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData, c.InsecureSkipTLSVerify = nil, true
		}, trust: Trust{InsecureTLS: true}},
		{name: "plain HTTP", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.Server = "http://169.254.169.254"
		}, refused: "clusters[c].cluster.server"},
		{name: "plain HTTP, allowed", edit: func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.Server, c.CertificateAuthorityData = "http://workload.example:8080", nil
		}, trust: Trust{InsecureTLS: true}},
		{name: "no current-context", edit: func(cfg *clientcmdapi.Config, _ *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			cfg.CurrentContext = ""
		}, invalid: "current-context"},
		{name: "a current-context that is not there", edit: func(cfg *clientcmdapi.Config, _ *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			cfg.CurrentContext = "elsewhere"
		}, invalid: "elsewhere"},
		{name: "exec in a context not used", edit: func(cfg *clientcmdapi.Config, _ *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			cfg.AuthInfos["person"] = &clientcmdapi.AuthInfo{Exec: exec, TokenFile: "/x"}
			cfg.Contexts["person"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "person"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := RESTConfig(kubeconfig(t, tc.edit), tc.trust)
			refused, isRefused := errors.AsType[*RefusedError](err)
			switch {
			case tc.refused != "":
				if !isRefused || refused.Field != tc.refused {
					t.Fatalf("got %v (%T); want %s refused", err, err, tc.refused)
				}
				if !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "inline data only") {
					t.Errorf("the message %q does not name the field and the rule", err)
				}
			case tc.invalid != "":
				if err == nil || isRefused || !strings.Contains(err.Error(), tc.invalid) {
					t.Fatalf("got %v; want an error about %s", err, tc.invalid)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				noFiles(t, cfg, tc.trust)
			}
		})
	}
}

// The flag that lifts a refusal is named in its message, and only there.
func TestRefusalsNameTheFlagThatAllowsThem(t *testing.T) {
	for field, want := range map[string]string{"exec": ExecFlag, "insecure": InsecureTLSFlag, "tokenFile": ""} {
		_, err := RESTConfig(kubeconfig(t, func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			switch field {
			case "exec":
				u.Exec = &clientcmdapi.ExecConfig{Command: "x", APIVersion: "client.authentication.k8s.io/v1"}
			case "insecure":
				c.CertificateAuthorityData, c.InsecureSkipTLSVerify = nil, true
			default:
				u.TokenFile = "/x"
			}
		}), Trust{})
		names := strings.Contains(err.Error(), "--insecure-kubeconfig")
		if want != "" && !strings.Contains(err.Error(), want) || want == "" && names {
			t.Errorf("%s: %v; want the flag %q named", field, err, want)
		}
	}
}

// noFiles fails t if cfg would read a file, run a command or trust a
// server unverified beyond what trust allows.
func noFiles(t testing.TB, cfg *rest.Config, trust Trust) {
	t.Helper()
	if cfg.BearerTokenFile != "" || cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" || cfg.AuthProvider != nil ||
		(cfg.ExecProvider != nil && !trust.Exec) || (cfg.Insecure && !trust.InsecureTLS) {
		t.Fatalf("a config that reads files or runs commands: %+v", cfg)
	}
}

func TestWithoutBodyKeepsTheCodeAndDropsTheAnswer(t *testing.T) {
	answer := "the page of an internal service"
	err := apierrors.NewGenericServerResponse(http.StatusInternalServerError, "GET", schema.GroupResource{}, "", answer, 0, true)
	if !strings.Contains(err.Error(), answer) {
		t.Fatalf("client-go's error no longer carries the answer, so this test proves nothing: %v", err)
	}
	got := withoutBody(err)
	if strings.Contains(got.Error(), answer) || !strings.Contains(got.Error(), "500") {
		t.Errorf("withoutBody: %v; want the code without the answer", got)
	}
	plain := errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	if withoutBody(plain) != plain {
		t.Error("an error that carries no answer was changed")
	}
}

// FuzzRESTConfig holds RESTConfig to its promise on any input: never a
// panic, and a config returned never reads a file, runs a command or skips
// verification unless trusted to.
func FuzzRESTConfig(f *testing.F) {
	f.Add(kubeconfig(f, nil), false, false)
	f.Add(kubeconfig(f, func(_ *clientcmdapi.Config, _ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
		u.Exec = &clientcmdapi.ExecConfig{Command: "sh", APIVersion: "client.authentication.k8s.io/v1"}
	}), true, false)
	f.Add(kubeconfig(f, func(_ *clientcmdapi.Config, c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
		c.InsecureSkipTLSVerify, c.CertificateAuthorityData, u.TokenFile = true, nil, "/t"
	}), false, true)
	f.Fuzz(func(t *testing.T, data []byte, exec, insecure bool) {
		trust := Trust{Exec: exec, InsecureTLS: insecure}
		cfg, err := RESTConfig(data, trust)
		if err != nil {
			if cfg != nil {
				t.Fatal("a config with an error")
			}
			return
		}
		noFiles(t, cfg, trust)
	})
}
