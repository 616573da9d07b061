package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/machinist-dev/machinist/internal/orphans"
)

// process is a control-plane process started again in the place of
// envtest's own, which was killed.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
}

// kill kills p and waits until it has exited.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ownChildren are this process's children called name whose command line
// holds arg: a test may run several control planes, each with its own
// directories.
func ownChildren(name, arg string) []int {
	var own []int
	for _, pid := range orphans.Children(name) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(raw), arg+"\x00") {
			own = append(own, pid)
		}
	}
	return own
}

// killOwn kills (SIGKILL) the one child called name whose command line
// holds arg, waits until it is gone (envtest's goroutine reaps it) and
// returns its command line, to be started again.
func killOwn(name, arg string) ([]string, error) {
	pids := ownChildren(name, arg)
	if len(pids) != 1 {
		return nil, fmt.Errorf("testenv: found %d %s processes of this control plane, want 1", len(pids), name)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(time.Minute); len(ownChildren(name, arg)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("testenv: %s still there a minute after SIGKILL", name)
		}
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), nil
}

// startAgain starts args, a command line killOwn returned, with its
// output appended to name.log in the environment's directory and killed
// with the test binary, and waits until ready succeeds. The process is
// returned even when it never got ready, for Stop to kill.
func (e *Env) startAgain(ctx context.Context, name string, args []string, ready func(context.Context) error) (*process, error) {
	log, err := os.OpenFile(filepath.Join(e.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: starting %s again: %w", name, err)
	}
	// Killed with the test binary, as envtest's own is.
	if err := orphans.Guard(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	for {
		err := ready(ctx)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return p, fmt.Errorf("testenv: %s exited; see %s", name, log.Name())
		case <-ctx.Done():
			return p, fmt.Errorf("testenv: %s not ready: %w (last: %v)", name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var errNotReady = errors.New("not ready")
