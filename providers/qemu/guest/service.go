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

// awaitServing waits until s, just started with exits, serves at path
// (a socket it makes once it is ready), for as long as it takes while s
// runs, as a service manager waits for a daemon to say it is ready. A
// fixed bound here was a bound on the host's load: containerd, under
// emulation on a 2-core host shared with other VMs, has taken more than
// 10 s to make its socket, and the machine then powered off for good
// while its Machine waited for a Node. How long a machine may take to
// join is its Machine's provisioning timeout and its health check's
// startup timeout, which heal it; not init's. An exit of s before that
// is an error. It reports whether stop came meanwhile.
func awaitServing(s *service, path string, exits <-chan *service, stop <-chan os.Signal) (stopped bool, err error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return false, nil
		}
		select {
		case <-stop:
			return true, nil
		case dead := <-exits:
			return false, fmt.Errorf("%s exited before it served at %s: %v", dead.name, path, dead.err)
		case <-tick.C:
		}
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
