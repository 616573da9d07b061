package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/apiserver"
)

// VerbsService is where the verbs server is registered in tests.
var VerbsService = types.NamespacedName{Namespace: "machinist-system", Name: "machinist-verbs"}

// Verbs is a verbs server running against an Env, registered with its
// kube-apiserver through an APIService.
type Verbs struct {
	// Server is the running server.
	Server *apiserver.Server

	env    *Env
	cancel context.CancelFunc
	done   chan error
}

// StartVerbs starts the aggregated verbs server on a free local port,
// registers it, and waits until kube-apiserver reports it Available.
func (e *Env) StartVerbs() (*Verbs, error) { return e.StartVerbsVia(e.Kubeconfig) }

// StartVerbsVia is StartVerbs with the server reaching kube-apiserver
// through the kubeconfig file at path (a fault-injecting proxy's, say).
func (e *Env) StartVerbsVia(kubeconfig string) (*Verbs, error) {
	srv, err := apiserver.New(apiserver.Options{
		CertDir:    filepath.Join(e.dir, "verbs"),
		Hosts:      apiserver.ServiceHosts(VerbsService),
		Kubeconfig: kubeconfig,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &Verbs{Server: srv, env: e, cancel: cancel, done: make(chan error, 1)}
	go func() { v.done <- srv.Run(ctx) }()
	if err := srv.RegisterLocal(ctx, e.Client, VerbsService, time.Minute); err != nil {
		return nil, errors.Join(err, v.Stop())
	}
	return v, nil
}

// Stop unregisters the server, so that the group is absent rather than
// unavailable, and stops it.
func (v *Verbs) Stop() error {
	ctx := context.Background()
	unregister := client.IgnoreNotFound(v.env.Client.Delete(ctx, &apiregv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: apiserver.APIServiceName}}))
	v.cancel()
	err := <-v.done
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return errors.Join(unregister, err)
}

// FrontProxyClient is the client certificate kube-apiserver's aggregator
// presents to the verbs server, for tests that speak to the server as the
// aggregator does.
func (e *Env) FrontProxyClient() (tls.Certificate, error) {
	dir := filepath.Join(e.dir, "front-proxy")
	return tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
}
