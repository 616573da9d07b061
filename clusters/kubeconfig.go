package clusters

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A WorkloadCluster's kubeconfig comes from a Secret that whoever may
// create Secrets in its namespace wrote. client-go would do whatever it
// says in the manager's process: run its exec plugin (a command, with the
// manager's files, network and credentials), read its *File fields from
// the manager's file system (the manager's own ServiceAccount token,
// sent to a server of the tenant's choosing), or trust any server. So a
// kubeconfig from a Secret is held to inline data, as Flux holds its own
// since GHSA-vvmq-fwmg-2gjc.

// Trust is what a kubeconfig from a Secret may ask of the manager beyond
// inline data. Both are off unless an operator turns them on (the
// manager's --insecure-kubeconfig-exec and --insecure-kubeconfig-tls),
// for clusters whose every WorkloadCluster author they trust with the
// manager's process.
type Trust struct {
	// Exec lets a kubeconfig's user run an exec credential plugin.
	Exec bool
	// InsecureTLS lets a kubeconfig skip verifying its server
	// (insecure-skip-tls-verify) or name a server without TLS (http://).
	InsecureTLS bool
}

// RefusedError says which field of a kubeconfig the manager refuses, and
// why.
type RefusedError struct {
	// Field is the field's place in the kubeconfig, such as
	// users[admin].user.exec.
	Field string
	// Why says what the field would have the manager do.
	Why string
	// Flag is the manager's flag that allows it, if any.
	Flag string
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("%s is refused: %s; a kubeconfig from a Secret may hold inline data only", e.Field, e.Why)
	if e.Flag != "" {
		msg += fmt.Sprintf(" (the manager's %s allows it, for every WorkloadCluster)", e.Flag)
	}
	return msg
}

// Flags that relax Trust, as the manager's command line names them.
const (
	ExecFlag        = "--insecure-kubeconfig-exec"
	InsecureTLSFlag = "--insecure-kubeconfig-tls"
)

// RESTConfig is the client configuration that kubeconfig's current
// context describes, built from its inline data alone. A field that would
// run a command, read a file, or (unless trust allows it) trust a server
// unverified is refused with a *RefusedError naming it; nothing outside
// the kubeconfig is read.
//
// A proxy-url is allowed: it reaches no host the server field could not
// name itself, and the server's certificate is still verified through
// it, end to end.
func RESTConfig(kubeconfig []byte, trust Trust) (*rest.Config, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	ctxName := cfg.CurrentContext
	if ctxName == "" {
		return nil, errors.New("it has no current-context")
	}
	kctx, ok := cfg.Contexts[ctxName]
	if !ok {
		return nil, fmt.Errorf("its current-context %q is not among its contexts", ctxName)
	}
	cluster, ok := cfg.Clusters[kctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("context %q names cluster %q, which it does not hold", ctxName, kctx.Cluster)
	}
	user, ok := cfg.AuthInfos[kctx.AuthInfo]
	if !ok && kctx.AuthInfo != "" {
		return nil, fmt.Errorf("context %q names user %q, which it does not hold", ctxName, kctx.AuthInfo)
	}
	if err := checkCluster(kctx.Cluster, cluster, trust); err != nil {
		return nil, err
	}
	if user != nil {
		if err := checkUser(kctx.AuthInfo, user, trust); err != nil {
			return nil, err
		}
	}
	// Only what was checked: the one context, its cluster and user.
	only := clientcmdapi.NewConfig()
	only.Clusters[kctx.Cluster] = cluster
	if user != nil {
		only.AuthInfos[kctx.AuthInfo] = user
	}
	only.Contexts[ctxName] = kctx
	only.CurrentContext = ctxName
	rc, err := clientcmd.NewDefaultClientConfig(*only, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, err
	}
	// What client-go made of it, checked again: a field a later client-go
	// adds that reads a file or runs a command must not slip through.
	switch {
	case rc.ExecProvider != nil && !trust.Exec, rc.AuthProvider != nil,
		rc.BearerTokenFile != "", rc.CAFile != "", rc.CertFile != "", rc.KeyFile != "",
		rc.Insecure && !trust.InsecureTLS:
		return nil, errors.New("it asks the manager to run a command, read a file or skip verifying the server, which a kubeconfig from a Secret may not")
	}
	return rc, nil
}

func checkCluster(name string, c *clientcmdapi.Cluster, trust Trust) error {
	field := func(f string) string { return fmt.Sprintf("clusters[%s].cluster.%s", name, f) }
	if c.CertificateAuthority != "" {
		return &RefusedError{Field: field("certificate-authority"),
			Why: "it names a file on the manager's host, which the manager would read and hand to new machines; give the CA as certificate-authority-data"}
	}
	if c.InsecureSkipTLSVerify && !trust.InsecureTLS {
		return &RefusedError{Field: field("insecure-skip-tls-verify"),
			Why: "the manager would send the cluster's credentials to whoever answers at the server's address", Flag: InsecureTLSFlag}
	}
	u, err := url.Parse(c.Server)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%s %q is not a URL such as https://host:6443", field("server"), c.Server)
	}
	if u.Scheme != "https" && !trust.InsecureTLS {
		return &RefusedError{Field: field("server"),
			Why: fmt.Sprintf("%s is not https, so nothing verifies the server and the credentials cross the network in the clear", u.Scheme), Flag: InsecureTLSFlag}
	}
	if c.ProxyURL != "" {
		p, err := url.Parse(c.ProxyURL)
		if err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https" && p.Scheme != "socks5") {
			return fmt.Errorf("%s %q is not a proxy URL (http, https or socks5)", field("proxy-url"), c.ProxyURL)
		}
	}
	return nil
}

func checkUser(name string, u *clientcmdapi.AuthInfo, trust Trust) error {
	field := func(f string) string { return fmt.Sprintf("users[%s].user.%s", name, f) }
	files := []struct{ field, value string }{
		{"tokenFile", u.TokenFile},
		{"client-certificate", u.ClientCertificate},
		{"client-key", u.ClientKey},
	}
	for _, f := range files {
		if f.value != "" {
			return &RefusedError{Field: field(f.field),
				Why: "it names a file on the manager's host, which the manager would read and send to the server (such as its own ServiceAccount token); give the credential inline (token, client-certificate-data, client-key-data)"}
		}
	}
	if u.Exec != nil && !trust.Exec {
		return &RefusedError{Field: field("exec"),
			Why: "it would run a command in the manager, with the manager's files, network and credentials", Flag: ExecFlag}
	}
	if u.AuthProvider != nil {
		return &RefusedError{Field: field("auth-provider"),
			Why: "an auth provider plugin runs code in the manager and keeps state of its own"}
	}
	return nil
}

// withoutBody is err with nothing a server answered in it: a request to
// whatever address a tenant's kubeconfig names (an internal service, say)
// is reported by its status code and a fixed text, never by the answer's
// body, which the manager would otherwise write into a WorkloadCluster's
// status and Events for the tenant to read. Errors without an answer
// (no route, a refused connection, a certificate that does not verify)
// are kept as they are.
func withoutBody(err error) error {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return err
	}
	code := int(status.Status().Code)
	text := http.StatusText(code)
	if text == "" {
		text = "an unknown status"
	}
	return fmt.Errorf("its API answered %d (%s)", code, strings.ToLower(text))
}
