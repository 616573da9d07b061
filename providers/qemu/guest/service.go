package guest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"
)

// service is one daemon init runs: the agent, or a real node's
// containerd and kubelet.
type service struct {
	name string
	argv []string
	// then, if set, runs once the daemon has ended at init's stop: a
	// real node's pods are stopped after its kubelet.
	then func(out io.Writer)

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited
	err  error         // cmd's exit, once done
}

// start starts the daemon; once it exits, it is sent on exits.
func (s *service) start(out io.Writer, exits chan<- *service) error {
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	go func() {
		s.err = cmd.Wait()
		close(done)
		exits <- s
	}()
	return nil
}

// stop asks the daemon to end (SIGTERM) and kills it if it has not
// within agentStopTimeout.
func (s *service) stop(out io.Writer) {
	fmt.Fprintf(out, "machinist: init: stopping %s\n", s.name)
	_ = s.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(agentStopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.stopped(out)
}

// stopped runs then, if set: the daemon has ended for good.
func (s *service) stopped(out io.Writer) {
	if s.then != nil {
		s.then(out)
	}
}

// supervise restarts each of the started services that exits, two
// seconds later, as a service manager restarts a kubelet that died,
// until stop; then it stops them, the last started first. exits is the
// channel they were started with, with room for one exit of each. A
// restart that fails stops the rest and is returned.
func supervise(out io.Writer, stop <-chan os.Signal, exits chan *service, services ...*service) error {
	stopAll := func(except *service) {
		for i := len(services) - 1; i >= 0; i-- {
			if services[i] != except {
				services[i].stop(out)
			} else {
				services[i].stopped(out)
			}
		}
	}
	for {
		var dead *service
		select {
		case <-stop:
			stopAll(nil)
			return nil
		case dead = <-exits:
		}
		fmt.Fprintf(out, "machinist: init: %s exited (%v); starting it again\n", dead.name, dead.err)
		select {
		case <-stop:
			stopAll(dead)
			return nil
		case <-time.After(2 * time.Second):
		}
		if err := dead.start(out, exits); err != nil {
			stopAll(dead)
			return err
		}
	}
}
