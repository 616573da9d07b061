// Package component runs one of Kubernetes' control-plane components
// (kube-controller-manager, kube-scheduler) as a child process beside an
// envtest kube-apiserver, with credentials of its own, and stops it the
// same way whichever it is: the packages that run each one say only how
// it is configured.
package component

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/internal/orphans"
)

// Options configure Start.
type Options struct {
	// Binary is the executable, and Args its command-line arguments.
	Binary string
	Args   []string
	// User is who it is to kube-apiserver: it gets a client certificate
	// of its own for this user, in a kubeconfig written to
	// KubeconfigFile, made anew at each start, which Args should name.
	User           envtest.User
	KubeconfigFile string
	// LogFile receives its standard output and error, appended to: the
	// terminal is for what a person should read.
	LogFile string
}

// Process is a running component.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
	err  error         // how it exited, once done is closed
}

// Start runs the component against env's kube-apiserver until Stop, or
// until this process dies: a watchdog then kills it, so that it never
// outlives its parent.
func Start(env *envtest.Environment, opts Options) (*Process, error) {
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("%w (make controlplane builds it)", err)
	}
	user, err := env.AddUser(opts.User, nil)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(opts.KubeconfigFile, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(opts.Binary, opts.Args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C meant for the parent must not stop it
	// before the parent has stopped what depends on it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(opts.Binary), err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = log.Close()
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
