package chaos_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// replica is one `machinist manager` process slot, restarted whenever its
// process exits, as the kubelet restarts a Deployment's container. Its
// output, across restarts, goes to one log file.
type replica struct {
	name string
	// metrics is where the replica serves /metrics, for a failed run's
	// account of its work queues.
	metrics string
	args    []string
	log     string

	mu      sync.Mutex
	cmd     *exec.Cmd
	started time.Time
	out     *bytes.Buffer // the current process's output
	exits   []exit
	killing bool // the next exit is a kill -9 of ours
	stopped bool
	held    chan struct{} // while not nil, a restart waits until it is closed
	done    chan struct{} // closed when the supervisor has ended
}

// exit is how one process of a replica ended.
type exit struct {
	At     time.Time
	Killed bool // by the harness, with SIGKILL
	Err    string
	Tail   string // its last lines of output
}

// startReplica starts a manager replica and its supervisor; extra are
// further flags of its command line.
func (r *run) startReplica(name string, extra ...string) *replica {
	metrics := freeAddress(r)
	rep := &replica{
		name:    name,
		metrics: metrics,
		log:     filepath.Join(r.dir, name+".log"),
		args: []string{"manager",
			"--kubeconfig=" + r.managerKubeconfig(),
			"--leader-elect", "--leader-election-namespace=" + leaseNamespace,
			"--leader-elect-lease-duration=" + leaseDuration.String(),
			"--leader-elect-renew-deadline=" + renewDeadline.String(),
			"--leader-elect-retry-period=" + retryPeriod.String(),
			"--metrics-bind-address=" + metrics, "--health-probe-bind-address=0",
			"--machine-workers=8", "--set-workers=2",
			"--process-state-dir=" + r.machines,
			fmt.Sprintf("--process-lease-duration-seconds=%d", agentLease),
			"--process-renew-interval=" + agentRenew.String(),
			"--node-grace=10s",
			"--log-level=info",
		},
		done: make(chan struct{}),
	}
	rep.args = append(rep.args, extra...)
	started := make(chan struct{})
	go rep.supervise(started)
	<-started
	r.replicas = append(r.replicas, rep)
	return rep
}

func (rep *replica) supervise(started chan struct{}) {
	defer close(rep.done)
	first := true
	for {
		rep.mu.Lock()
		if rep.stopped {
			rep.mu.Unlock()
			if first {
				close(started)
			}
			return
		}
		log, err := os.OpenFile(rep.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(log, "=== %s start %s\n", time.Now().Format(time.RFC3339Nano), rep.name)
		out := &bytes.Buffer{}
		cmd := exec.Command(binary, rep.args...)
		w := &lockedWriter{mu: &rep.mu, w: []interface{ Write([]byte) (int, error) }{log, out}}
		// Killed with the test binary by the watchdog over the binary
		// (TestMain), never left behind.
		cmd.Stdout, cmd.Stderr = w, w
		err = cmd.Start()
		rep.cmd, rep.out, rep.started = cmd, out, time.Now()
		rep.mu.Unlock()
		if first {
			close(started)
			first = false
		}
		if err != nil {
			panic(err)
		}
		err = cmd.Wait()
		rep.mu.Lock()
		e := exit{At: time.Now(), Killed: rep.killing, Tail: tail(out.String(), 8)}
		if err != nil {
			e.Err = err.Error()
		}
		rep.exits = append(rep.exits, e)
		rep.killing = false
		fmt.Fprintf(log, "=== %s exit %s: %v (killed by the harness: %v)\n", e.At.Format(time.RFC3339Nano), rep.name, err, e.Killed)
		_ = log.Close()
		stopped := rep.stopped
		rep.mu.Unlock()
		if stopped {
			return
		}
		rep.mu.Lock()
		held := rep.held
		rep.mu.Unlock()
		if held != nil {
			<-held
		}
		// On purpose: a restart takes this long, as a real one would.
		time.Sleep(restartDelay)
	}
}

// kill sends SIGKILL to the running process; the supervisor restarts it.
func (rep *replica) kill() {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.cmd == nil || rep.cmd.ProcessState != nil {
		return
	}
	rep.killing = true
	_ = rep.cmd.Process.Kill()
}

// hold keeps the replica from restarting until release.
func (rep *replica) hold() {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.held = make(chan struct{})
}

// release lets a held replica restart.
func (rep *replica) release() {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.held != nil {
		close(rep.held)
		rep.held = nil
	}
}

// stop ends the supervisor and the process, with SIGTERM, as a rollout of
// the Deployment would, and returns how the last process exited.
func (rep *replica) stop() {
	rep.mu.Lock()
	rep.stopped = true
	cmd := rep.cmd
	if rep.held != nil {
		close(rep.held)
		rep.held = nil
	}
	rep.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-rep.done:
	case <-time.After(time.Minute):
		if cmd != nil && cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
		<-rep.done
	}
}

// leading reports whether the running process holds the leader Lease.
func (rep *replica) leading() bool {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.out != nil && rep.cmd != nil && rep.cmd.ProcessState == nil &&
		strings.Contains(strings.ToLower(rep.out.String()), "successfully acquired lease")
}

// unplannedExits are the exits the harness did not cause.
func (rep *replica) unplannedExits() []exit {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	var out []exit
	for _, e := range rep.exits {
		if !e.Killed && !rep.stoppedAt(e) {
			out = append(out, e)
		}
	}
	return out
}

// checkLeaderExits fails t unless rep's unplanned exits are what an
// operator may see when kube-apiserver is out of reach: at most one, clean
// and saying it lost the leader election, and none at all unless mayExit
// (its leader Lease was out of reach); whyNot says why not, for the
// message. It returns the exits.
func (rep *replica) checkLeaderExits(t *testing.T, mayExit bool, whyNot string) []exit {
	t.Helper()
	exits := rep.unplannedExits()
	switch {
	case !mayExit && len(exits) > 0:
		t.Errorf("the manager exited %d times though %s; last:\n%s", len(exits), whyNot, exits[len(exits)-1].Tail)
	case len(exits) > 1:
		t.Errorf("the manager exited %d times (a crash loop); last:\n%s", len(exits), exits[len(exits)-1].Tail)
	}
	for _, e := range exits {
		if !strings.Contains(e.Tail, "leader election lost") || strings.Contains(e.Tail, "panic") {
			t.Errorf("the manager exited (%s) without saying it lost the election:\n%s", e.Err, e.Tail)
		}
	}
	return exits
}

// stoppedAt reports whether e is the exit stop caused. Callers hold mu.
func (rep *replica) stoppedAt(e exit) bool {
	return rep.stopped && len(rep.exits) > 0 && rep.exits[len(rep.exits)-1] == e
}

// output is the current process's output so far.
func (rep *replica) output() string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.out == nil {
		return ""
	}
	return rep.out.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  []interface{ Write([]byte) (int, error) }
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.w {
		if _, err := w.Write(b); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddress is a loopback address with a port free now. The manager binds
// it a moment later; a lost race fails the run, saying so.
func freeAddress(r *run) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	r.must(err)
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// queues reports, from the replica's /metrics, each controller's queue
// depth, retries and reconcile errors so far: what a stalled run was
// waiting on.
func (rep *replica) queues() string {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + rep.metrics + "/metrics")
	if err != nil {
		return fmt.Sprintf("\n  %s: no metrics: %v", rep.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, m := range []string{"workqueue_depth{", "workqueue_retries_total{", "controller_runtime_reconcile_errors_total{", "workqueue_unfinished_work_seconds{", "controller_runtime_reconcile_total{"} {
			if strings.HasPrefix(line, m) {
				fmt.Fprintf(&b, "\n  %s: %s", rep.name, line)
			}
		}
	}
	return b.String()
}
