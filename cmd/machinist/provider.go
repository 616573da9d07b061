package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu"
)

func providerCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "provider",
		Short: "Serve a provider over the provider protocol, or check one against it",
		Long: `Providers can run out of the manager's process and speak the provider
protocol (gRPC, docs/providers.md) over a Unix socket or TCP with mutual
TLS. "serve" offers a built-in provider that way, as the reference
implementation; "conformance" checks any provider against the contract.`,
	}
	cmd.AddCommand(providerServeCommand())
	cmd.AddCommand(providerConformanceCommand())
	return cmd
}

func providerServeCommand() *cobra.Command {
	var (
		name     string
		endpoint string
		tlsFiles plugin.TLSFiles
		control  string
		machines process.Options
		vms      qemu.Options
		logs     cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "serve --provider inmemory|process|qemu --endpoint unix:///path/to.sock",
		Short: "Serve a built-in provider over the provider protocol",
		Long: `Serve the inmemory, the process or the qemu provider on --endpoint until
SIGTERM or Ctrl-C. A manager reaches it with --provider NAME=ENDPOINT.

The inmemory provider's machines live in this process and end with it.
The process provider's machines are agent processes that outlive it; a
new "serve" over the same --process-state-dir takes them over as it
starts: it adopts the agents still running and boots the machines whose
agents it had stopped (--process-exit-with-parent), and answers Probe as
ready once it has. Serve one provider per state directory.

The qemu provider's machines are QEMU VMs booting this host's packaged
Linux kernel (Debian: apt-get install qemu-system-x86
linux-image-cloud-amd64), kept in --qemu-state-dir, where each VM's serial
console is logged (console.log); like agents, they outlive the provider
and are taken over by the next.

It needs no credentials for any cluster: each machine joins its own with
the join data the manager hands over, and a repaired one deletes its old
Node itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logs.SetUp(); err != nil {
				return err
			}
			ctx := ctrl.SetupSignalHandler()
			var (
				a     providers.Actuator
				ready func(context.Context) error
			)
			switch name {
			case inmemory.Name:
				p, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: machines.LeaseDurationSeconds, RenewInterval: machines.RenewInterval})
				if err != nil {
					return err
				}
				defer p.Stop()
				if control != "" {
					stop, err := serveControl(control, p.ControlHandler())
					if err != nil {
						return err
					}
					defer stop()
				}
				a = p
			case process.Name, qemu.Name:
				p, exitWithParent, err := hostProvider(name, machines, vms)
				if err != nil {
					return err
				}
				if exitWithParent {
					// The machines end with this provider (machinist
					// run): stopped in order rather than killed.
					defer func() {
						stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						defer cancel()
						_ = p.Stop(stopCtx)
					}()
				}
				// Otherwise never stopped: the machines outlive the
				// provider, as real ones outlive their controller.
				a = p
				ready = takeOver(ctx, p)
			default:
				return fmt.Errorf("--provider %q: the built-in providers are %s, %s and %s", name, inmemory.Name, process.Name, qemu.Name)
			}
			return plugin.Serve(logr.NewContext(ctx, ctrl.Log), endpoint, a, plugin.ServeOptions{Name: name, VendorVersion: version(), TLS: tlsFiles, Ready: ready})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&name, "provider", "", "the built-in provider to serve: inmemory, process or qemu")
	fs.StringVar(&endpoint, "endpoint", "", "where to serve: unix:///path/to.sock, or tcp://host:port with --tls-*")
	cli.AddServerTLSFlags(fs, &tlsFiles)
	fs.StringVar(&control, "inmemory-control", "", "unix:///path: also serve the inmemory provider's fault injection and books there, for tests")
	fs.StringVar(&machines.StateDir, "process-state-dir", "", "the process provider's state directory")
	fs.StringVar(&machines.AgentBinary, "process-agent-binary", "", "the machinist binary the agents run; empty means this one")
	fs.BoolVar(&machines.ExitWithParent, "process-exit-with-parent", false, "kill the agents when this process dies (for machinist run, whose control plane dies with it)")
	cli.AddQEMUFlags(fs, &vms)
	fs.BoolVar(&vms.ExitWithParent, "qemu-exit-with-parent", false, "power the VMs off when this process dies (for machinist run, whose control plane dies with it)")
	fs.Int32Var(&machines.LeaseDurationSeconds, "lease-duration-seconds", 0, "the machines' Node Lease duration (0: 40)")
	fs.DurationVar(&machines.RenewInterval, "renew-interval", 0, "how often the machines renew their Node Leases (0: 10s)")
	_ = cmd.MarkFlagRequired("provider")
	_ = cmd.MarkFlagRequired("endpoint")
	logs.Add(fs)
	return cmd
}

// hostProvider makes the process or the qemu provider, whose machines
// (agent processes, VMs) run on this host, and says whether they end with
// this process.
func hostProvider(name string, machines process.Options, vms qemu.Options) (*process.Provider, bool, error) {
	if name == process.Name {
		if machines.StateDir == "" {
			return nil, false, errors.New("--provider process needs --process-state-dir")
		}
		p, err := process.New(machines)
		return p, machines.ExitWithParent, err
	}
	if vms.StateDir == "" {
		return nil, false, errors.New("--provider qemu needs --qemu-state-dir")
	}
	vms.Log = ctrl.Log.WithName("qemu")
	vms.LeaseDurationSeconds, vms.RenewInterval = machines.LeaseDurationSeconds, machines.RenewInterval
	p, err := qemu.New(vms)
	return p, vms.ExitWithParent, err
}

// serveControl serves h over HTTP on a Unix socket until stop is called.
func serveControl(endpoint string, h http.Handler) (stop func(), err error) {
	e, err := plugin.ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if e.Network != "unix" {
		return nil, fmt.Errorf("--inmemory-control %s: only a Unix socket, which only this host's users reach", endpoint)
	}
	lis, err := plugin.Listen(e)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return func() { _ = srv.Close(); _ = os.Remove(e.Address) }, nil
}

// release is the version an image build stamps on the binary
// (-ldflags -X main.release=...); empty in other builds.
var release string

// version is the version the binary was built as, for people: the
// release stamped on it, else the module version.
func version() string {
	if release != "" {
		return release
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

// takeOver takes p's machines over in the background as serving starts:
// over a settled fleet nothing may call the provider for hours, and the
// machines its last run stopped must not wait for a call to boot. The
// function it returns answers Probe: not ready until the first attempt is
// done, so that a manager's first calls do not queue behind it. A failed
// attempt (one machine it could not boot) is logged and tried again with
// backoff until one succeeds, as well as by the next call.
func takeOver(ctx context.Context, p *process.Provider) func(context.Context) error {
	first := make(chan struct{})
	go func() {
		log := ctrl.Log.WithName("takeover")
		once := sync.OnceFunc(func() { close(first) })
		defer once()
		backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: math.MaxInt32}
		_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
			err := p.TakeOver(ctx)
			once()
			if err != nil {
				log.Error(err, "taking the machines over; trying again")
				return false, nil
			}
			return true, nil
		})
	}()
	return func(context.Context) error {
		select {
		case <-first:
			return nil
		default:
			return errors.New("taking over the machines in --process-state-dir")
		}
	}
}
