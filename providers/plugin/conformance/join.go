package conformance

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers"
)

// The suite hands every Create and Repair join data of its own: a
// bootstrap token made for that call alone, so that a Node's join can be
// traced to the call whose data it used (by the CertificateSigningRequest
// the token's user made), and so that the provider's log can be searched
// for every secret it was given.

// tokenTTL is how long a token the suite makes is valid; each is deleted
// when its check ends, and this bounds one an interrupted run leaves.
const tokenTTL = time.Hour

// token is a bootstrap token the suite made.
type token struct {
	bootstrap.Token
	// check is the slug of the check it was made for, for messages.
	check string
}

// newJoin makes a bootstrap token for the trial and returns join data
// carrying it. The trial deletes it when it ends.
func (t *trial) newJoin(ctx context.Context) (providers.Join, error) {
	callCtx, cancel := context.WithTimeout(ctx, t.s.cfg.Timeout)
	defer cancel()
	made, err := bootstrap.NewToken()
	if err != nil {
		return providers.Join{}, err
	}
	secret := bootstrap.TokenSecret(made, bootstrap.TokenOptions{
		Expiration:  time.Now().Add(tokenTTL),
		Description: "machinist provider conformance, check " + t.slug,
		Groups:      t.s.cfg.TokenGroups,
	})
	if _, err := t.s.cfg.Kube.CoreV1().Secrets(secret.Namespace).Create(callCtx, secret, metav1.CreateOptions{}); err != nil {
		return providers.Join{}, fmt.Errorf("making bootstrap token %s: %w", made, err)
	}
	k := token{Token: made, check: t.slug}
	t.mu.Lock()
	t.tokens = append(t.tokens, k)
	t.mu.Unlock()
	t.s.handedOver(k)
	return providers.Join{Server: t.s.cfg.Server, CAData: t.s.cfg.CAData, Token: made.Value()}, nil
}

// joinFor is the join data of m's Creates: one token per Machine, as
// the controller makes one per Machine, so that concurrent Creates for
// one UID carry the same.
func (t *trial) joinFor(ctx context.Context, uid string) (providers.Join, error) {
	t.mu.Lock()
	j, ok := t.joins[uid]
	t.mu.Unlock()
	if ok {
		return j, nil
	}
	t.joinMu.Lock()
	defer t.joinMu.Unlock()
	t.mu.Lock()
	j, ok = t.joins[uid]
	t.mu.Unlock()
	if ok {
		return j, nil
	}
	j, err := t.newJoin(ctx)
	if err != nil {
		return providers.Join{}, err
	}
	t.mu.Lock()
	t.joins[uid] = j
	t.mu.Unlock()
	return j, nil
}

// deleteTokens deletes the trial's bootstrap tokens.
func (t *trial) deleteTokens(ctx context.Context) error {
	t.mu.Lock()
	tokens := slices.Clone(t.tokens)
	t.mu.Unlock()
	var errs []error
	for _, k := range tokens {
		err := t.s.cfg.Kube.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, k.SecretName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting bootstrap token %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// tokenOf is the token a Join the suite made carries.
func tokenOf(j providers.Join) token {
	id, secret, _ := strings.Cut(j.Token, ".")
	return token{Token: bootstrap.Token{ID: id, Secret: secret}}
}

// joinedWith checks that nodeName joined with k: that k's user asked for
// a certificate for system:node:<nodeName> and was given one.
func (s *suite) joinedWith(ctx context.Context, k token, nodeName, call string) error {
	callCtx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	csrs, err := s.cfg.Kube.CertificatesV1().CertificateSigningRequests().List(callCtx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing CertificateSigningRequests: %w", err)
	}
	want := "system:node:" + nodeName
	var asked []string
	for _, csr := range csrs.Items {
		if csr.Spec.Username != k.User() {
			continue
		}
		cn, err := requestedName(csr.Spec.Request)
		if err != nil {
			asked = append(asked, fmt.Sprintf("%s (%v)", csr.Name, err))
			continue
		}
		if cn == want && len(csr.Status.Certificate) > 0 {
			return nil
		}
		asked = append(asked, fmt.Sprintf("%s for %s, %s", csr.Name, cn, csrState(csr)))
	}
	if len(asked) == 0 {
		return fmt.Errorf("Node %s is Ready, but nothing joined with the join data handed to %s: no CertificateSigningRequest from %s (the machine did not get its credentials with bootstrap token %s)", nodeName, call, k.User(), k.ID)
	}
	return fmt.Errorf("Node %s is Ready, but no certificate for %s was issued to %s, whose join data %s handed over; its CertificateSigningRequests: %s", nodeName, want, k.User(), call, strings.Join(asked, "; "))
}

// requestedName is the common name a CSR asks a certificate for.
func requestedName(request []byte) (string, error) {
	block, _ := pem.Decode(request)
	if block == nil {
		return "", errors.New("its request is not PEM")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", err
	}
	return req.Subject.CommonName, nil
}

func csrState(csr certificatesv1.CertificateSigningRequest) string {
	if len(csr.Status.Certificate) > 0 {
		return "issued"
	}
	for _, c := range csr.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			return strings.ToLower(string(c.Type))
		}
	}
	return "pending"
}

// leaks finds where log holds the secret of any of tokens, as it is or
// base64-encoded (as a Secret, a kubeconfig's data or a protobuf dump
// would show it), and says so for each, naming the token by its public
// ID and showing the line with every secret blanked out.
func leaks(log []byte, tokens []token) error {
	var errs []error
	for _, k := range tokens {
		for _, form := range secretForms(k) {
			at := bytes.Index(log, []byte(form))
			if at < 0 {
				continue
			}
			how := "secret"
			if form != k.Secret {
				how = "base64-encoded secret"
			}
			errs = append(errs, fmt.Errorf("the provider logged the %s of bootstrap token %s (handed over by the %s check): %s",
				how, k.ID, k.check, redactedLine(log, at, tokens)))
			break
		}
	}
	return errors.Join(errs...)
}

// secretForms are the ways a token's secret may show in a log.
func secretForms(k token) []string {
	return []string{
		k.Secret,
		base64.StdEncoding.EncodeToString([]byte(k.Value())),
		base64.StdEncoding.EncodeToString([]byte(k.Secret)),
		base64.RawURLEncoding.EncodeToString([]byte(k.Value())),
		base64.RawURLEncoding.EncodeToString([]byte(k.Secret)),
	}
}

// redactedLine is the line of log at offset at, with every form of every
// token's secret blanked out, cut short if long.
func redactedLine(log []byte, at int, tokens []token) string {
	start := bytes.LastIndexByte(log[:at], '\n') + 1
	end := bytes.IndexByte(log[at:], '\n')
	if end < 0 {
		end = len(log)
	} else {
		end += at
	}
	line := string(log[start:end])
	for _, k := range tokens {
		for _, form := range secretForms(k) {
			line = strings.ReplaceAll(line, form, "<secret>")
		}
	}
	const most = 300
	if len(line) > most {
		line = line[:most] + "…"
	}
	return fmt.Sprintf("%q", line)
}
