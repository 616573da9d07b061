// Package bootstrap is how a machine joins a cluster the way a kubelet
// does: with a short-lived bootstrap token it asks the cluster for a client
// certificate of its own (TLS bootstrapping), and from then on it is
// system:node:<name>, confined by the Node authorizer and NodeRestriction.
package bootstrap

import "fmt"

// Join is what a new machine needs to join its cluster. The manager makes
// one per Machine and hands it to the provider with Create (and with a
// Repair, which joins afresh); the machine's agent uses it once, to get
// its own credentials.
type Join struct {
	// Server is the URL of the cluster's API server.
	Server string
	// CAData is the PEM bundle that verifies the API server's certificate.
	CAData []byte
	// TLSServerName, when set, is the name the API server's certificate
	// is verified against, where Server reaches it under another name: a
	// VM reaches its host's loopback through its gateway's address. A
	// provider sets it for its own machines; the manager does not, and
	// the provider protocol does not carry it.
	TLSServerName string
	// Token is the bootstrap token, "<id>.<secret>". It is a credential:
	// never log it (String and GoString leave it out).
	Token string
}

// IsZero reports whether j carries nothing.
func (j Join) IsZero() bool { return j.Server == "" && len(j.CAData) == 0 && j.Token == "" }

// String describes j without its token's secret, so that a Join printed
// by mistake leaks nothing.
func (j Join) String() string {
	return fmt.Sprintf("join %s with token %s", j.Server, redact(j.Token))
}

// GoString is String, for %#v.
func (j Join) GoString() string { return j.String() }

// redact keeps a token's public ID and hides its secret.
func redact(token string) string {
	for i := range len(token) {
		if token[i] == '.' {
			return token[:i] + ".<redacted>"
		}
	}
	if token == "" {
		return "<none>"
	}
	return "<redacted>"
}
