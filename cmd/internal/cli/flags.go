package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/qemu"
)

// AddQEMUFlags adds the flags of the qemu provider, in process or served.
func AddQEMUFlags(fs *pflag.FlagSet, o *qemu.Options) {
	fs.StringVar(&o.StateDir, "qemu-state-dir", "", "the qemu provider's state directory: one directory per VM, with its disk, console log and QMP socket")
	fs.StringVar(&o.GuestBinary, "qemu-guest-binary", "", "the static machinist binary each VM runs as its init; empty means this one")
	fs.StringVar(&o.Accel, "qemu-accel", "", "kvm or tcg; empty means KVM if a probe boot under it succeeds, else TCG")
	fs.Var(nodeDir{o}, "qemu-node-dir", "what make node builds (bin/node): the kubelet, containerd, runc, the CNI plugins and the images of a real node's guest, which a class asks for with providerSpec guest: kubelet, and in kubelets/ the kubelets of other versions; empty means no class may")
}

// nodeDir is --qemu-node-dir: it sets the Options' Node files.
type nodeDir struct{ o *qemu.Options }

func (d nodeDir) String() string {
	if d.o == nil || d.o.Node == nil {
		return ""
	}
	return d.o.Node.Bin
}

func (d nodeDir) Set(dir string) error {
	d.o.Node = qemu.NodeDir(dir)
	return nil
}

func (nodeDir) Type() string { return "dir" }

// AddServerTLSFlags adds a provider server's mutual-TLS flags.
func AddServerTLSFlags(fs *pflag.FlagSet, f *plugin.TLSFiles) {
	fs.StringVar(&f.CA, "tls-client-ca", "", "CA that signed the clients' certificates (mutual TLS; required for tcp://)")
	fs.StringVar(&f.Cert, "tls-cert", "", "this provider's certificate (PEM)")
	fs.StringVar(&f.Key, "tls-key", "", "this provider's key (PEM)")
}

// AddClientTLSFlags adds the mutual-TLS flags of a provider's client,
// each name after prefix.
func AddClientTLSFlags(fs *pflag.FlagSet, prefix string, f *plugin.TLSFiles) {
	fs.StringVar(&f.CA, prefix+"tls-ca", "", "CA that signed the providers' certificates (mutual TLS; required for tcp:// endpoints)")
	fs.StringVar(&f.Cert, prefix+"tls-cert", "", "the client certificate presented to providers (PEM)")
	fs.StringVar(&f.Key, prefix+"tls-key", "", "the client key (PEM)")
}

// RestConfig loads a kubeconfig file, or the in-cluster configuration.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("not in a cluster, and no --kubeconfig: %w", err)
		}
		return cfg, nil
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// Deadline is a one-shot command's context: parent, ended by Ctrl-C or
// SIGTERM, or once timeout has passed.
func Deadline(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stop() }
}
