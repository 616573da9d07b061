package testenv

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"go.uber.org/zap/zapcore"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

// Controllers are Machinist's controllers and an inmemory provider running
// against an Env.
type Controllers struct {
	// Provider is the "inmemory" provider, for injecting faults and
	// reading its books: in this process, or served by one of its own.
	Provider Provider
	// Served is the provider's process when it is served out of process.
	Served *ServedInmemory
	// Manager runs the controllers.
	Manager *manager.Manager

	env *Env
	// config is the manager's; the provider always acts as the admin.
	config *rest.Config
	opts   manager.Options
	cancel context.CancelFunc
	done   chan error
	// stopProvider ends the provider's machines.
	stopProvider func() error
}

// Leases configures the inmemory provider's kubelet Leases; tests use short
// ones so that a crash shows within seconds.
type Leases struct {
	DurationSeconds int32
	RenewInterval   time.Duration
}

// StartControllers starts the manager with an inmemory provider registered
// as "inmemory", unless opts.Actuators brings the providers (then Provider
// is nil). opts.Registry is filled in; metrics go to a private registry so
// that several managers can run in one process.
func (e *Env) StartControllers(opts manager.Options, leases Leases) (*Controllers, error) {
	return e.startControllers(e.Config, opts, leases)
}

// StartControllersAs is StartControllers with the manager acting as user
// (through impersonation), so that only what user may do works: run it as
// the manager's ServiceAccount bound to the machinist-manager ClusterRole
// to prove that role and the admission policies let the controllers work.
// The provider's machines still act as the admin, as kubelets would with
// their own credentials.
func (e *Env) StartControllersAs(user rest.ImpersonationConfig, opts manager.Options, leases Leases) (*Controllers, error) {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = user
	return e.startControllers(cfg, opts, leases)
}

// StartControllersVia is StartControllers with the manager reaching
// kube-apiserver through cfg (a fault-injecting proxy, say); the
// provider's machines still reach it directly, as kubelets would.
func (e *Env) StartControllersVia(cfg *rest.Config, opts manager.Options, leases Leases) (*Controllers, error) {
	return e.startControllers(cfg, opts, leases)
}

func (e *Env) startControllers(cfg *rest.Config, opts manager.Options, leases Leases) (*Controllers, error) {
	if opts.Actuators != nil {
		// The caller brings its providers (and stops them).
		c := &Controllers{env: e, config: cfg, stopProvider: func() error { return nil }}
		opts.Repeatable = true
		c.opts = opts
		return c, c.startManager()
	}
	p, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: leases.DurationSeconds, RenewInterval: leases.RenewInterval})
	if err != nil {
		return nil, err
	}
	c := &Controllers{Provider: p, env: e, config: cfg, stopProvider: func() error { p.Stop(); return nil }}
	return c, c.start(opts, p)
}

// StartServedControllers is StartControllers with the inmemory provider
// served by `machinist provider serve`, a process of its own, and reached
// over its Unix socket as any out-of-process provider is.
func (e *Env) StartServedControllers(opts manager.Options, leases Leases) (*Controllers, error) {
	served, err := e.ServeInmemory(leases)
	if err != nil {
		return nil, err
	}
	c := &Controllers{Provider: served, Served: served, env: e, config: e.Config, stopProvider: served.Stop}
	return c, c.start(opts, served.Client)
}

func (c *Controllers) start(opts manager.Options, a providers.Actuator) error {
	opts.Actuators = providers.NewRegistry()
	if err := opts.Actuators.Register(inmemory.Name, a); err != nil {
		return errors.Join(err, c.stopProvider())
	}
	// The manager may be started again in this process (RestartManager).
	opts.Repeatable = true
	c.opts = opts
	if err := c.startManager(); err != nil {
		return errors.Join(err, c.stopProvider())
	}
	return nil
}

func (c *Controllers) startManager() error {
	c.opts.Registry = prometheus.NewRegistry()
	if c.opts.JoinServer == "" {
		// Machines join kube-apiserver itself, even when the manager
		// reaches it through a proxy.
		c.opts.JoinServer, c.opts.JoinCAData = c.env.Config.Host, c.env.Config.CAData
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := manager.New(ctx, c.config, c.env.Scheme, c.opts)
	if err != nil {
		cancel()
		return err
	}
	c.Manager, c.cancel, c.done = mgr, cancel, make(chan error, 1)
	go func() { c.done <- mgr.Start(ctx) }()
	return nil
}

func (c *Controllers) stopManager() error {
	if c.cancel == nil {
		return nil
	}
	c.cancel()
	c.cancel = nil
	err := <-c.done
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Register makes a available to the controllers as the provider name,
// beside the inmemory provider: a provider that misbehaves in a way the
// test needs, say.
func (c *Controllers) Register(name string, a providers.Actuator) error {
	return c.opts.Actuators.Register(name, a)
}

// RestartManager stops the manager, as a crash would, and starts a new one
// with the same options; the provider's machines keep running meanwhile.
func (c *Controllers) RestartManager() error {
	if err := c.stopManager(); err != nil {
		return err
	}
	return c.startManager()
}

// Paused stops the manager, runs f while no controller acts (the
// provider's machines keep running), and starts a new manager with the
// same options, even if f failed.
func (c *Controllers) Paused(f func() error) error {
	if err := c.stopManager(); err != nil {
		return err
	}
	ferr := f()
	return errors.Join(ferr, c.startManager())
}

// Stop stops the manager, then the provider's machines.
func (c *Controllers) Stop() error {
	return errors.Join(c.stopManager(), c.stopProvider())
}

// StartWithControllers starts a control plane and, against it, the
// controllers with an inmemory provider; stop ends both, controllers first.
func StartWithControllers(opts manager.Options, leases Leases) (e *Env, c *Controllers, stop func() error, err error) {
	return startWith((*Env).StartControllers, opts, leases)
}

// StartWithServedControllers is StartWithControllers with the provider
// served out of process (StartServedControllers).
func StartWithServedControllers(opts manager.Options, leases Leases) (e *Env, c *Controllers, stop func() error, err error) {
	return startWith((*Env).StartServedControllers, opts, leases)
}

func startWith(start func(*Env, manager.Options, Leases) (*Controllers, error), opts manager.Options, leases Leases) (e *Env, c *Controllers, stop func() error, err error) {
	if e, err = Start(); err != nil {
		return nil, nil, nil, err
	}
	if c, err = start(e, opts, leases); err != nil {
		_ = e.Stop()
		return nil, nil, nil, err
	}
	return e, c, func() error { return errors.Join(c.Stop(), e.Stop()) }, nil
}

// InmemoryClass creates a MachineClass of the inmemory provider; spec is
// its providerSpec as JSON, empty for none.
func (e *Env) InmemoryClass(ctx context.Context, ns, name, spec string) error {
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineClassSpec{Provider: inmemory.Name},
	}
	if spec != "" {
		class.Spec.ProviderSpec = runtime.RawExtension{Raw: []byte(spec)}
	}
	return e.Client.Create(ctx, class)
}

// RunWithControllers is a TestMain body for a package whose tests share
// one control plane (with opts) and one set of controllers (with mgr and
// leases): ready receives both before the tests run. Controllers log
// errors only, to standard error: what failed, not every transition.
func RunWithControllers(m *testing.M, opts Options, mgr manager.Options, leases Leases, ready func(*Env, *Controllers)) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	return RunWithOptions(m, opts, func(e *Env) (func(), error) {
		c, err := e.StartControllers(mgr, leases)
		if err != nil {
			return nil, err
		}
		ready(e, c)
		return func() { _ = c.Stop() }, nil
	})
}
