package testenv

import (
	"context"
	"fmt"

	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// Join makes a fresh bootstrap token for this cluster, stores its Secret
// (described by opts: its expiration, labels) and returns what a machine
// joins this cluster with: the API server, the CA bundle that verifies
// it, and the token. A test hands it to nodeagent.Join or to a provider.
func (e *Env) Join(ctx context.Context, opts bootstrap.TokenOptions) (bootstrap.Join, error) {
	token, err := bootstrap.NewToken()
	if err != nil {
		return bootstrap.Join{}, err
	}
	if opts.Description == "" {
		opts.Description = "a test's machine"
	}
	if err := e.Client.Create(ctx, bootstrap.TokenSecret(token, opts)); err != nil {
		return bootstrap.Join{}, fmt.Errorf("testenv: storing bootstrap token %s: %w", token, err)
	}
	return bootstrap.Join{Server: e.Config.Host, CAData: e.Config.CAData, Token: token.Value()}, nil
}

// ClusterCA is the PEM of the CA that the cluster's client certificates,
// a joined machine's among them, are signed by.
func (e *Env) ClusterCA() []byte { return e.ca.CertPEM() }
