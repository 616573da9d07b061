package bootstrap

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// NodeGroup is the group a Machinist bootstrap token authenticates in,
// beside Kubernetes' own system:bootstrappers. The RBAC of this package
// lets that group ask for a node's first client certificate and have it
// approved, and nothing else; a token of another tool, in another group,
// gets none of it.
const NodeGroup = "system:bootstrappers:machinist:nodes"

// DefaultTokenTTL is how long a token made without an expiration lasts:
// long enough for a slow machine to boot and join, short enough that a
// leaked token soon stops working.
const DefaultTokenTTL = time.Hour

// Token is a bootstrap token in kubeadm's format, "<id>.<secret>": ID is
// 6 characters of [a-z0-9] and public (it names the token's Secret),
// Secret is 16 and is the credential. String and GoString leave the
// secret out; Value is the whole token.
type Token struct {
	ID     string
	Secret string
}

// NewToken makes a random token.
func NewToken() (Token, error) {
	s, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return Token{}, fmt.Errorf("bootstrap: making a token: %w", err)
	}
	return ParseToken(s)
}

// ParseToken reads "<id>.<secret>". Its error never contains the secret.
func ParseToken(s string) (Token, error) {
	if !bootstraputil.IsValidBootstrapToken(s) {
		return Token{}, fmt.Errorf("bootstrap: %s is not a bootstrap token (want %q)", redact(s), bootstrapapi.BootstrapTokenPattern)
	}
	id, secret, _ := strings.Cut(s, ".")
	return Token{ID: id, Secret: secret}, nil
}

// Value is the whole token, the bearer credential a Join carries.
func (t Token) Value() string { return bootstraputil.TokenFromIDAndSecret(t.ID, t.Secret) }

// String is the token without its secret, safe to log.
func (t Token) String() string { return redact(t.Value()) }

// GoString is String, for %#v.
func (t Token) GoString() string { return t.String() }

// User is the user kube-apiserver authenticates a request bearing t as,
// and so the requester of the CertificateSigningRequests a machine makes
// with it: what ties a joined Node back to the token it was given.
func (t Token) User() string { return bootstrapapi.BootstrapUserPrefix + t.ID }

// SecretName is the name of the token's Secret in kube-system, which
// kube-apiserver's bootstrap token authenticator looks it up by.
func (t Token) SecretName() string { return bootstraputil.BootstrapTokenSecretName(t.ID) }

// TokenOptions describe a token's Secret.
type TokenOptions struct {
	// Expiration is when the token stops authenticating and
	// kube-controller-manager's token cleaner deletes its Secret; zero
	// means DefaultTokenTTL from now.
	Expiration time.Time
	// Description is for a person reading the Secret.
	Description string
	// Labels are put on the Secret so that its owner can find it again
	// (say, the token made for one Machine).
	Labels map[string]string
	// Groups are the groups the token authenticates in besides
	// system:bootstrappers; none means NodeGroup, the group
	// InstallRBAC lets join. Others are for a cluster bootstrapped by
	// another tool, such as kubeadm's
	// system:bootstrappers:kubeadm:default-node-token. Each must be
	// system:bootstrappers:<something>, or kube-apiserver refuses the
	// token altogether.
	Groups []string
}

// TokenSecret is the Secret that makes t a bootstrap token of its
// cluster, in kubeadm's format: kube-apiserver (with
// --enable-bootstrap-token-auth) authenticates t as
// system:bootstrap:<id> in groups system:bootstrappers and NodeGroup
// (or opts.Groups) until the expiration. It is usable for authentication only, not for
// signing the cluster-info ConfigMap.
func TokenSecret(t Token, opts TokenOptions) *corev1.Secret {
	expiration := opts.Expiration
	if expiration.IsZero() {
		expiration = time.Now().Add(DefaultTokenTTL)
	}
	groups := NodeGroup
	if len(opts.Groups) > 0 {
		groups = strings.Join(opts.Groups, ",")
	}
	var labels map[string]string
	if len(opts.Labels) > 0 {
		labels = make(map[string]string, len(opts.Labels))
		for k, v := range opts.Labels {
			labels[k] = v
		}
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem,
			Name:      t.SecretName(),
			Labels:    labels,
		},
		Type: corev1.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenIDKey:               []byte(t.ID),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(t.Secret),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(expiration.UTC().Format(time.RFC3339)),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(groups),
			bootstrapapi.BootstrapTokenDescriptionKey:      []byte(opts.Description),
		},
	}
}

// TokenFromSecret reads the token a bootstrap token Secret holds.
func TokenFromSecret(s *corev1.Secret) (Token, error) {
	if s == nil || s.Type != corev1.SecretTypeBootstrapToken {
		return Token{}, errors.New("bootstrap: not a bootstrap token Secret")
	}
	t, err := ParseToken(bootstraputil.TokenFromIDAndSecret(
		string(s.Data[bootstrapapi.BootstrapTokenIDKey]), string(s.Data[bootstrapapi.BootstrapTokenSecretKey])))
	if err != nil {
		return Token{}, fmt.Errorf("bootstrap: Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	if s.Name != t.SecretName() {
		return Token{}, fmt.Errorf("bootstrap: Secret %s/%s holds token %s, whose Secret is named %s", s.Namespace, s.Name, t, t.SecretName())
	}
	return t, nil
}
