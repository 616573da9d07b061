package joinable

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// What Check tries, as Finding.Check names it.
const (
	CheckBootstrapTokens = "bootstrap-token authentication"
	CheckBindings        = "join bindings"
	CheckNodeAuthorizer  = "Node authorizer"
	CheckApprover        = "certificate approver"
	CheckSigner          = "certificate signer"
	CheckNodeRestriction = "NodeRestriction"
	CheckTokenCleaner    = "token cleaner"
)

// Reasons a check fails for, as Finding.Reason gives them: stable words a
// script can match, where Detail and Fix are for a person.
const (
	ReasonBootstrapTokensRefused = "BootstrapTokensRefused"
	ReasonBindingsMissing        = "JoinBindingsMissing"
	ReasonNodeAuthorizerOff      = "NodeAuthorizerOff"
	ReasonCertificateNotApproved = "CertificateNotApproved"
	ReasonCertificateDenied      = "CertificateDenied"
	ReasonCertificateNotIssued   = "CertificateNotIssued"
	ReasonNodeRestrictionOff     = "NodeRestrictionOff"
	ReasonTokenCleanerOff        = "TokenCleanerOff"
	ReasonCheckFailed            = "CheckFailed"
)

// Result is how a check came out.
type Result string

// A check passed, failed, or could not be made because one before it
// failed.
const (
	Passed  Result = "ok"
	Failed  Result = "missing"
	Skipped Result = "not checked"
)

// Finding is one check's outcome.
type Finding struct {
	// Check is what was checked (CheckBootstrapTokens, …).
	Check string
	// Result says how it came out.
	Result Result
	// Reason is, for a failure, one of the Reason constants.
	Reason string
	// Detail is what was seen, in Machinist's own words: a condition
	// may carry it.
	Detail string
	// Said is what the cluster itself said of a failure (a certificate
	// request's denial, the groups a token was given), "" for none. It
	// is the cluster's text, of any length, so it is for the person who
	// ran the check, never for a status.
	Said string
	// Fix is, for a failure, what to change on the cluster.
	Fix string
}

// Blocks reports whether a failed f keeps machines from joining: every
// failure does but the token cleaner's, whose lack leaves expired tokens
// behind and lets machines join.
func (f Finding) Blocks() bool {
	return f.Result == Failed && f.Reason != ReasonTokenCleanerOff
}

// Report is every check's Finding, in the order they were made.
type Report []Finding

// Joinable reports whether no check failed.
func (r Report) Joinable() bool {
	return !slices.ContainsFunc(r, func(f Finding) bool { return f.Result == Failed })
}

// Failures are the findings that failed.
func (r Report) Failures() []Finding {
	var out []Finding
	for _, f := range r {
		if f.Result == Failed {
			out = append(out, f)
		}
	}
	return out
}

// DefaultWait is how long Check gives kube-controller-manager to approve
// and sign a certificate request, and to delete an expired token: it
// does each within a second or two when it runs the controller.
const DefaultWait = 30 * time.Second

// probeTTL is how long the token Check makes lives, should Check be
// killed before it deletes it: the token cleaner, or its expiry, ends it.
const probeTTL = 10 * time.Minute

// ProbeLabel marks the token Secrets Check makes, and deletes again.
const ProbeLabel = "machinist.dev/join-probe"

// Options tune Check.
type Options struct {
	// Wait: zero means DefaultWait.
	Wait time.Duration
}

// Check tries, on cfg's cluster, each thing a Machinist machine's join
// relies on, as that machine would: it makes a bootstrap token of
// Machinist's group (for ten minutes at most), authenticates with it,
// asks with it for a node's client certificate, and acts as that node;
// it asks kube-apiserver what the join bindings and the Node authorizer
// allow; and it makes an expired token for the token cleaner to delete.
// What it makes it deletes. cfg needs a cluster administrator's rights
// (Secrets in kube-system, SubjectAccessReviews, certificate requests).
// The error is for a check that could not start; a check that failed is
// in the Report.
func Check(ctx context.Context, cfg *rest.Config, opts Options) (Report, error) {
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	wait := opts.Wait
	if wait <= 0 {
		wait = DefaultWait
	}
	tok, err := bootstrap.NewToken()
	if err != nil {
		return nil, err
	}
	secret := bootstrap.TokenSecret(tok, bootstrap.TokenOptions{
		Expiration:  time.Now().Add(probeTTL),
		Description: "made by Machinist to check that machines can join this cluster; deleted once checked",
		Labels:      map[string]string{ProbeLabel: "true"},
	})
	if _, err := admin.CoreV1().Secrets(secret.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("making a bootstrap token to check with (Secret %s/%s): %w", secret.Namespace, secret.Name, err)
	}
	defer deleteSecret(ctx, admin, secret.Name)

	// The token cleaner is only waited for; it is checked meanwhile.
	cleaner := make(chan Finding, 1)
	go func() { cleaner <- checkTokenCleaner(ctx, admin, wait) }()

	node := "machinist-probe-" + tok.ID
	var r Report
	r = append(r, checkBootstrapTokens(ctx, cfg, tok))
	tokens := r[len(r)-1].Result == Passed
	r = append(r, checkBindings(ctx, admin, tok, node))
	bindings := r[len(r)-1].Result == Passed
	r = append(r, checkNodeAuthorizer(ctx, admin, node))
	authorizer := r[len(r)-1].Result == Passed
	approver, signer, creds := checkCertificate(ctx, admin, cfg, tok, node, wait, tokens, bindings)
	r = append(r, approver, signer)
	r = append(r, checkNodeRestriction(ctx, cfg, creds, node, authorizer))
	r = append(r, <-cleaner)
	return r, nil
}

func passed(check, detail string) Finding {
	return Finding{Check: check, Result: Passed, Detail: detail}
}

func skipped(check, detail string) Finding {
	return Finding{Check: check, Result: Skipped, Detail: detail}
}

func failed(check, reason, detail, fix string) Finding {
	return Finding{Check: check, Result: Failed, Reason: reason, Detail: detail, Fix: fix}
}

// tokenConfig is cfg with tok as its only credential.
func tokenConfig(cfg *rest.Config, tok bootstrap.Token) *rest.Config {
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = tok.Value()
	return c
}

// checkBootstrapTokens asks kube-apiserver who tok is. Its authenticator
// reads token Secrets through a cache, so a refusal is asked again for a
// few seconds before it counts.
func checkBootstrapTokens(ctx context.Context, cfg *rest.Config, tok bootstrap.Token) Finding {
	kube, err := kubernetes.NewForConfig(tokenConfig(cfg, tok))
	if err != nil {
		return failed(CheckBootstrapTokens, ReasonCheckFailed, err.Error(), "")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		switch {
		case err == nil:
			u := review.Status.UserInfo
			if !slices.Contains(u.Groups, bootstrap.NodeGroup) {
				f := failed(CheckBootstrapTokens, ReasonBootstrapTokensRefused,
					fmt.Sprintf("a bootstrap token of group %s authenticated without that group", bootstrap.NodeGroup),
					"let kube-apiserver's bootstrap token authenticator (--enable-bootstrap-token-auth), not another authenticator, read bootstrap tokens")
				f.Said = "groups " + strings.Join(u.Groups, ", ")
				return f
			}
			return passed(CheckBootstrapTokens, fmt.Sprintf("a bootstrap token authenticates as %s in %s", u.Username, bootstrap.NodeGroup))
		case apierrors.IsUnauthorized(err) && time.Now().Before(deadline):
			if sleep(ctx, 250*time.Millisecond) != nil {
				return failed(CheckBootstrapTokens, ReasonCheckFailed, ctx.Err().Error(), "")
			}
		case apierrors.IsUnauthorized(err):
			return failed(CheckBootstrapTokens, ReasonBootstrapTokensRefused,
				"kube-apiserver refused a bootstrap token (401 Unauthorized): machines cannot authenticate to ask for their certificates",
				"start kube-apiserver with --enable-bootstrap-token-auth=true")
		default:
			return failed(CheckBootstrapTokens, ReasonCheckFailed, "asking who a bootstrap token is: "+err.Error(), "")
		}
	}
}

// checkBindings asks kube-apiserver whether each join binding's grant is
// in force, for a Machinist token's user or for a node.
func checkBindings(ctx context.Context, admin kubernetes.Interface, tok bootstrap.Token, node string) Finding {
	_, bindings, err := bootstrap.RBAC()
	if err != nil {
		return failed(CheckBindings, ReasonCheckFailed, err.Error(), "")
	}
	var missing []string
	for _, b := range bindings {
		attrs := grantOf(b.RoleRef.Name, node)
		if attrs == nil {
			return failed(CheckBindings, ReasonCheckFailed, "nothing says what binding "+b.Name+" grants", "")
		}
		user, groups := tok.User(), []string{"system:bootstrappers", bootstrap.NodeGroup}
		if b.Subjects[0].Name == bootstrap.NodesGroup {
			user, groups = "system:node:"+node, []string{bootstrap.NodesGroup}
		}
		ok, err := allowed(ctx, admin, user, groups, attrs)
		if err != nil {
			return failed(CheckBindings, ReasonCheckFailed, err.Error(), "")
		}
		if !ok {
			missing = append(missing, b.Name)
		}
	}
	if len(missing) > 0 {
		return failed(CheckBindings, ReasonBindingsMissing,
			fmt.Sprintf("missing ClusterRoleBindings %s: a Machinist bootstrap token may not ask for a node certificate and have it approved, or a node may not renew its own or register afresh", strings.Join(missing, ", ")),
			"run `machinist cluster prepare` without --dry-run, or `kubectl apply -k config/join`")
	}
	return passed(CheckBindings, fmt.Sprintf("the %d join bindings are in force", len(bindings)))
}

// grantOf is what the join binding of role lets its subjects do, asked
// as node where the subject is a node.
func grantOf(role, node string) *authorizationv1.ResourceAttributes {
	csrs := func(sub string) *authorizationv1.ResourceAttributes {
		return &authorizationv1.ResourceAttributes{Verb: "create", Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Subresource: sub}
	}
	switch role {
	case bootstrap.RoleNodeBootstrapper:
		return csrs("")
	case bootstrap.RoleNodeClient:
		return csrs("nodeclient")
	case bootstrap.RoleSelfNodeClient:
		return csrs("selfnodeclient")
	case bootstrap.RoleNodeRegisterAfresh:
		return &authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes", Name: node}
	}
	return nil
}

// checkNodeAuthorizer asks whether a node may renew its own Lease, which
// only the Node authorizer grants (kube-apiserver's own RBAC policy binds
// nodes to nothing).
func checkNodeAuthorizer(ctx context.Context, admin kubernetes.Interface, node string) Finding {
	ok, err := allowed(ctx, admin, "system:node:"+node, []string{bootstrap.NodesGroup}, &authorizationv1.ResourceAttributes{
		Namespace: corev1.NamespaceNodeLease, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: node,
	})
	switch {
	case err != nil:
		return failed(CheckNodeAuthorizer, ReasonCheckFailed, err.Error(), "")
	case !ok:
		return failed(CheckNodeAuthorizer, ReasonNodeAuthorizerOff,
			"a node may not renew its own Lease: kube-apiserver does not authorize nodes with the Node authorizer",
			"add Node to kube-apiserver's --authorization-mode, before RBAC (--authorization-mode=Node,RBAC)")
	}
	return passed(CheckNodeAuthorizer, "a node may renew its own Lease")
}

func allowed(ctx context.Context, admin kubernetes.Interface, user string, groups []string, attrs *authorizationv1.ResourceAttributes) (bool, error) {
	review, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: append(groups, "system:authenticated"), ResourceAttributes: attrs},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("asking what %s may do: %w", user, err)
	}
	return review.Status.Allowed, nil
}

// credentials are a node's client certificate and key.
type credentials struct{ cert, key []byte }

// checkCertificate asks, with tok, for node's client certificate as a
// machine's agent does, and waits for kube-controller-manager to approve
// and sign it. It returns the certificate, for checkNodeRestriction to
// act as the node.
func checkCertificate(ctx context.Context, admin kubernetes.Interface, cfg *rest.Config, tok bootstrap.Token, node string, wait time.Duration, tokens, bindings bool) (approver, signer Finding, creds *credentials) {
	if !tokens || !bindings {
		why := "needs a bootstrap token that authenticates, and the join bindings"
		return skipped(CheckApprover, why), skipped(CheckSigner, why), nil
	}
	fail := func(err error) (Finding, Finding, *credentials) {
		return failed(CheckApprover, ReasonCheckFailed, err.Error(), ""), skipped(CheckSigner, "no certificate was asked for"), nil
	}
	kube, err := kubernetes.NewForConfig(tokenConfig(cfg, tok))
	if err != nil {
		return fail(err)
	}
	req, err := nodeagent.RequestCertificate(ctx, kube, node)
	if err != nil {
		return fail(err)
	}
	name := req.Name
	defer deleteCSR(ctx, admin, name)

	deadline := time.Now().Add(wait)
	approved := false
	for {
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fail(fmt.Errorf("reading CertificateSigningRequest %s: %w", name, err))
		}
		for _, c := range got.Status.Conditions {
			switch c.Type {
			case certificatesv1.CertificateApproved:
				approved = true
			case certificatesv1.CertificateDenied:
				f := failed(CheckApprover, ReasonCertificateDenied,
					"a node's certificate request was denied", "see who denies node certificate requests: kube-controller-manager's approver never does")
				f.Said = c.Reason + ": " + c.Message
				return f, skipped(CheckSigner, "the certificate request was denied"), nil
			case certificatesv1.CertificateFailed:
				f := failed(CheckSigner, ReasonCertificateNotIssued, "signing a node's certificate failed",
					"give kube-controller-manager the cluster CA with --cluster-signing-cert-file and --cluster-signing-key-file")
				f.Said = c.Reason + ": " + c.Message
				return passed(CheckApprover, "a node's certificate request was approved"), f, nil
			}
		}
		if approved && len(got.Status.Certificate) > 0 {
			creds = &credentials{cert: got.Status.Certificate, key: req.KeyPEM}
			return passed(CheckApprover, "a node's certificate request was approved"), passed(CheckSigner, "a node's certificate was issued"), creds
		}
		if !time.Now().Before(deadline) {
			break
		}
		if sleep(ctx, 250*time.Millisecond) != nil {
			return fail(ctx.Err())
		}
	}
	if !approved {
		return failed(CheckApprover, ReasonCertificateNotApproved,
				fmt.Sprintf("a node's certificate request was not approved within %s: nothing approves node certificate requests", wait),
				"run kube-controller-manager with its certificate approver (in --controllers: certificatesigningrequest-approving-controller, or * which includes it)"),
			skipped(CheckSigner, "the certificate request was not approved"), nil
	}
	return passed(CheckApprover, "a node's certificate request was approved"),
		failed(CheckSigner, ReasonCertificateNotIssued,
			fmt.Sprintf("an approved node certificate request was not signed within %s", wait),
			"run kube-controller-manager with its certificate signer (in --controllers: certificatesigningrequest-signing-controller, or *), given the cluster CA with --cluster-signing-cert-file and --cluster-signing-key-file"), nil
}

// checkNodeRestriction acts as the node creds name and asks, dry run, to
// make another node's Node: the Node authorizer allows it, and only
// NodeRestriction refuses it.
func checkNodeRestriction(ctx context.Context, cfg *rest.Config, creds *credentials, node string, authorizer bool) Finding {
	if creds == nil || !authorizer {
		return skipped(CheckNodeRestriction, "needs a node certificate and the Node authorizer")
	}
	c := rest.AnonymousClientConfig(cfg)
	c.CertData, c.KeyData = creds.cert, creds.key
	kube, err := kubernetes.NewForConfig(c)
	if err != nil {
		return failed(CheckNodeRestriction, ReasonCheckFailed, err.Error(), "")
	}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node + "-other"}}
	_, err = kube.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return failed(CheckNodeRestriction, ReasonNodeRestrictionOff,
			"a node could make another node's Node: kube-apiserver does not confine nodes to their own objects",
			"add NodeRestriction to kube-apiserver's --enable-admission-plugins")
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "is not allowed to modify node"):
		return passed(CheckNodeRestriction, "a node may not make another node's Node")
	default:
		return skipped(CheckNodeRestriction, "could not tell: "+err.Error())
	}
}

// checkTokenCleaner makes an expired token and waits for its Secret to go.
func checkTokenCleaner(ctx context.Context, admin kubernetes.Interface, wait time.Duration) Finding {
	tok, err := bootstrap.NewToken()
	if err != nil {
		return failed(CheckTokenCleaner, ReasonCheckFailed, err.Error(), "")
	}
	s := bootstrap.TokenSecret(tok, bootstrap.TokenOptions{
		Expiration:  time.Now().Add(-time.Minute),
		Description: "made expired by Machinist, to check that the token cleaner deletes it",
		Labels:      map[string]string{ProbeLabel: "true"},
	})
	secrets := admin.CoreV1().Secrets(s.Namespace)
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return failed(CheckTokenCleaner, ReasonCheckFailed, "making an expired token: "+err.Error(), "")
	}
	deadline := time.Now().Add(wait)
	for {
		_, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return passed(CheckTokenCleaner, "an expired token's Secret was deleted")
		case err != nil:
			deleteSecret(ctx, admin, s.Name)
			return failed(CheckTokenCleaner, ReasonCheckFailed, err.Error(), "")
		case !time.Now().Before(deadline):
			deleteSecret(ctx, admin, s.Name)
			return failed(CheckTokenCleaner, ReasonTokenCleanerOff,
				fmt.Sprintf("an expired bootstrap token's Secret was still there after %s: expired tokens of machines that never joined would stay in kube-system", wait),
				"run kube-controller-manager with its token cleaner, which is off by default (kubeadm sets --controllers=*,bootstrapsigner,tokencleaner)")
		}
		if sleep(ctx, 250*time.Millisecond) != nil {
			deleteSecret(ctx, admin, s.Name)
			return failed(CheckTokenCleaner, ReasonCheckFailed, ctx.Err().Error(), "")
		}
	}
}

// cleanupTimeout bounds the deletion of what a check made, which runs
// even when the check's context has ended.
const cleanupTimeout = 10 * time.Second

func deleteSecret(ctx context.Context, admin kubernetes.Interface, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = admin.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, name, metav1.DeleteOptions{})
}

func deleteCSR(ctx context.Context, admin kubernetes.Interface, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, name, metav1.DeleteOptions{})
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
