// Package controllermanager runs Kubernetes' own kube-controller-manager
// beside a kube-apiserver, with the controllers a machine fleet relies on:
// the garbage collector (owner references cascade deletions), the
// namespace controller (a deleted namespace empties) and the node
// lifecycle controller (a Node whose kubelet stops renewing its Lease is
// marked Ready=Unknown). `machinist run` and the tests that need them use
// it, so that what Kubernetes does is done by Kubernetes, as in a cluster.
package controllermanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/machinist-dev/machinist/internal/orphans"
)

// Controllers are the kube-controller-manager controllers started.
var Controllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"node-lifecycle-controller",
}

// Options configure Start.
type Options struct {
	// Binary is the kube-controller-manager executable.
	Binary string
	// Kubeconfig is a kubeconfig file with the controller manager's own
	// credentials.
	Kubeconfig string
	// Log receives its log; nil discards it.
	Log io.Writer
	// NodeMonitorGracePeriod is how long a Node's kubelet may go without
	// renewing its Lease or posting status before the Node is marked
	// Ready=Unknown; zero keeps Kubernetes' default (50s). NodeMonitorPeriod
	// is how often Nodes are looked at; zero keeps the default (5s).
	NodeMonitorGracePeriod, NodeMonitorPeriod time.Duration
}

// Process is a running kube-controller-manager.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
	err  error         // how it exited, once done is closed
}

// Args are the command-line arguments Start runs the binary with.
func (o Options) Args() []string {
	args := []string{
		"--kubeconfig=" + o.Kubeconfig,
		"--controllers=" + strings.Join(Controllers, ","),
		// One host, one controller manager: nothing to elect.
		"--leader-elect=false",
		// Its controllers act with its own credentials; no service account
		// token controller runs to mint theirs.
		"--use-service-account-credentials=false",
		// Nothing scrapes or probes it here.
		"--secure-port=0",
	}
	if o.NodeMonitorGracePeriod > 0 {
		args = append(args, "--node-monitor-grace-period="+o.NodeMonitorGracePeriod.String())
	}
	if o.NodeMonitorPeriod > 0 {
		args = append(args, "--node-monitor-period="+o.NodeMonitorPeriod.String())
	}
	return args
}

// Start runs kube-controller-manager until Stop, or until this process
// dies: a watchdog then kills it, so that it never outlives its parent.
func Start(opts Options) (*Process, error) {
	if opts.Binary == "" || opts.Kubeconfig == "" {
		return nil, errors.New("controllermanager: Options needs a Binary and a Kubeconfig")
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("controllermanager: %w (make controlplane builds it)", err)
	}
	out := opts.Log
	if out == nil {
		out = io.Discard
	}
	cmd := exec.Command(opts.Binary, opts.Args()...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a Ctrl-C meant for the parent must not stop it
	// before the parent has stopped what depends on it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(opts.Binary), err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := orphans.Guard(cmd.Process.Pid); err != nil {
		return nil, errors.Join(err, p.Stop(context.Background()))
	}
	return p, nil
}

// Exited is closed when the process has exited; Err then says how.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err is how the process exited, once Exited is closed.
func (p *Process) Err() error { return p.err }

// Stop sends SIGTERM, then SIGKILL once ctx ends, and waits until it is gone.
func (p *Process) Stop(ctx context.Context) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.done
		return nil
	}
}
