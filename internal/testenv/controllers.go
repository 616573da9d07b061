package testenv

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machinist-dev/machinist/actuators"
	"github.com/machinist-dev/machinist/actuators/inmemory"
	"github.com/machinist-dev/machinist/internal/manager"
)

// Controllers are Machinist's controllers and an inmemory provider running
// against an Env.
type Controllers struct {
	// Provider is the "inmemory" provider, for injecting faults.
	Provider *inmemory.Provider
	// Manager runs the controllers.
	Manager *manager.Manager

	cancel context.CancelFunc
	done   chan error
}

// Leases configures the inmemory provider's kubelet Leases; tests use short
// ones so that a crash shows within seconds.
type Leases struct {
	DurationSeconds int32
	RenewInterval   time.Duration
}

// StartControllers starts the manager with an inmemory provider registered
// as "inmemory". opts.Actuators and opts.Registry are filled in; metrics go
// to a private registry so that several managers can run in one process.
func (e *Env) StartControllers(opts manager.Options, leases Leases) (*Controllers, error) {
	provider, err := inmemory.New(inmemory.Options{
		Config: e.Config, LeaseDurationSeconds: leases.DurationSeconds, RenewInterval: leases.RenewInterval,
	})
	if err != nil {
		return nil, err
	}
	opts.Actuators = actuators.NewRegistry()
	if err := opts.Actuators.Register(inmemory.Name, provider); err != nil {
		provider.Stop()
		return nil, err
	}
	opts.Registry = prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := manager.New(ctx, e.Config, e.Scheme, opts)
	if err != nil {
		cancel()
		provider.Stop()
		return nil, err
	}
	c := &Controllers{Provider: provider, Manager: mgr, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- mgr.Start(ctx) }()
	return c, nil
}

// Stop stops the manager, then the provider's machines.
func (c *Controllers) Stop() error {
	c.cancel()
	err := <-c.done
	c.Provider.Stop()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
