package nodeagent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// JoinError is a failed join as the machine explains it: Reason is one of
// machinistv1.JoinFailureReasons, for a script, and Message says what was
// seen and what to change on the cluster, for a person. Neither carries
// the token, nor anything that changes from one attempt to the next (a
// request's name, a time), so that a Machine reporting it again changes
// nothing.
type JoinError struct {
	Reason  string
	Message string
	// Err is the error underneath, for logs.
	Err error
}

func (e *JoinError) Error() string {
	if e.Err == nil {
		return e.Message
	}
	return e.Message + ": " + e.Err.Error()
}

func (e *JoinError) Unwrap() error { return e.Err }

// Progress hears, while a join has not succeeded, why: each failed
// attempt, and a certificate request still waiting after
// CertificatePatience. It is called from the joining goroutine.
type Progress func(*JoinError)

// JoinGrace is how long a join fails before it says so: a token just
// made is refused for a moment, until kube-apiserver's cache of token
// Secrets holds it, and that refusal is no news to anyone.
const JoinGrace = 10 * time.Second

// Patient is p silent for JoinGrace from now; nil stays nil.
func (p Progress) Patient() Progress {
	if p == nil {
		return nil
	}
	from := time.Now()
	return func(e *JoinError) {
		if time.Since(from) >= JoinGrace {
			p(e)
		}
	}
}

// CertificatePatience is how long a join waits for its certificate
// before it reports why none came; it keeps waiting for the same request
// after, so that a cluster whose approver is down is not sent a new
// request every minute by every machine.
const CertificatePatience = 20 * time.Second

// explainRequest explains why asking server for a node certificate
// failed.
func explainRequest(server string, err error) *JoinError {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var netErr net.Error
	switch {
	case apierrors.IsUnauthorized(err):
		return &JoinError{Reason: machinistv1.ReasonBootstrapTokenRefused, Err: err,
			Message: "the cluster refused the bootstrap token (401): is --enable-bootstrap-token-auth set on its kube-apiserver, and is the token's Secret still in kube-system?"}
	case apierrors.IsForbidden(err):
		return &JoinError{Reason: machinistv1.ReasonJoinForbidden, Err: err,
			Message: "the cluster forbids the bootstrap token to ask for a node certificate (403): run `machinist cluster prepare` against it to install the join bindings"}
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid):
		return &JoinError{Reason: machinistv1.ReasonJoinServerUnreachable, Err: err,
			Message: fmt.Sprintf("the machine cannot verify the API server %s: is the CA it was given (the kubeconfig's, or the WorkloadCluster's spec.joinEndpoint) the one that signed the server's certificate?", server)}
	case errors.As(err, &netErr), strings.Contains(err.Error(), "connection refused"), strings.Contains(err.Error(), "no such host"):
		return &JoinError{Reason: machinistv1.ReasonJoinServerUnreachable, Err: err,
			Message: fmt.Sprintf("the machine cannot reach the API server %s: can machines reach that address (set the WorkloadCluster's spec.joinEndpoint if they reach the cluster elsewhere)?", server)}
	}
	return &JoinError{Reason: machinistv1.ReasonJoinFailed, Err: err,
		Message: fmt.Sprintf("asking %s for a node certificate failed", server)}
}

// explainWait says why the certificate request name has no certificate
// yet, from its conditions.
func explainWait(ctx context.Context, kube kubernetes.Interface, name string, waited time.Duration) *JoinError {
	req, err := kube.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return &JoinError{Reason: machinistv1.ReasonJoinFailed, Err: err,
			Message: "the node's certificate request cannot be read (deleted, or the token expired): the machine asks again"}
	}
	for _, c := range req.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return explainDenied(c)
		}
	}
	for _, c := range req.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved {
			return &JoinError{Reason: machinistv1.ReasonJoinCertificateNotIssued,
				Message: fmt.Sprintf("the node's certificate request was approved but not issued within %s: is kube-controller-manager signing kubernetes.io/kube-apiserver-client-kubelet requests (--cluster-signing-cert-file and --cluster-signing-key-file)?", waited)}
		}
	}
	return &JoinError{Reason: machinistv1.ReasonJoinCertificateNotApproved,
		Message: fmt.Sprintf("the node's certificate request was not approved within %s: is kube-controller-manager running its certificate approver (certificatesigningrequest-approving-controller, in --controllers), and are the join bindings installed (`machinist cluster prepare`)?", waited)}
}

func explainDenied(c certificatesv1.CertificateSigningRequestCondition) *JoinError {
	why := c.Reason
	if c.Message != "" {
		why += ": " + c.Message
	}
	return &JoinError{Reason: machinistv1.ReasonJoinCertificateDenied,
		Message: fmt.Sprintf("the node's certificate request was %s (%s): the machine asks again; see who denies kubernetes.io/kube-apiserver-client-kubelet requests on the cluster", strings.ToLower(string(c.Type)), why)}
}

// ExplainJoin is err as a JoinError: itself, when a join already
// explained it, or the explanation of an unexpected failure otherwise.
func ExplainJoin(err error) *JoinError {
	if je, ok := errors.AsType[*JoinError](err); ok {
		return je
	}
	return &JoinError{Reason: machinistv1.ReasonJoinFailed, Message: "the join failed", Err: err}
}
