package upgrade_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// Leader election timed as the chaos tests time it, so that a replica
// that takes over does not wait out client-go's 15 s for nothing.
const (
	leaseNamespace = "machinist-upgrade"
	nodeGrace      = 20 * time.Second
)

// manager is one `machinist manager` process of one binary, as one pod of
// the manager's Deployment.
type manager struct {
	name    string
	cmd     *exec.Cmd
	out     *testenv.LockedBuffer
	metrics string
	// done is closed when the process has ended, err how.
	done chan struct{}
	err  error
}

// startManager runs binary's manager with the process provider's machines
// in stateDir: the same command line for both releases, as a Deployment
// whose image alone changes.
func startManager(t *testing.T, name, binary, stateDir string) *manager {
	t.Helper()
	m := &manager{name: name, out: &testenv.LockedBuffer{}, done: make(chan struct{}),
		metrics: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	m.cmd = exec.Command(binary, "manager",
		"--kubeconfig="+env.Kubeconfig,
		"--leader-elect", "--leader-election-namespace="+leaseNamespace,
		"--leader-elect-lease-duration=8s", "--leader-elect-renew-deadline=6s", "--leader-elect-retry-period=1s",
		"--metrics-bind-address="+m.metrics, "--health-probe-bind-address=0",
		"--machine-workers=8", "--set-workers=2",
		"--process-state-dir="+stateDir,
		"--process-lease-duration-seconds=15", "--process-renew-interval=2s",
		"--node-grace=10s", "--log-level=info")
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("starting the %s manager: %v", name, err)
	}
	go func() { m.err = m.cmd.Wait(); close(m.done) }()
	t.Cleanup(func() {
		m.stop(t)
		if t.Failed() {
			f, err := os.CreateTemp("", "machinist-upgrade-"+m.name+"-*.log")
			if err == nil {
				_, _ = f.WriteString(m.out.String())
				_ = f.Close()
				path := f.Name()
				t.Logf("the %s manager's last lines (all in %s):\n%s", m.name, path, tail(m.out.String(), 30))
			}
		}
	})
	return m
}

// stop ends the process as the kubelet ends a pod's container: SIGTERM,
// and SIGKILL after a grace period.
func (m *manager) stop(t *testing.T) {
	t.Helper()
	if ended, _ := m.exited(); ended {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		t.Errorf("the %s manager did not stop within 30 s of SIGTERM; killed", m.name)
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// exited says whether the process has ended, and how.
func (m *manager) exited() (bool, error) {
	select {
	case <-m.done:
		return true, m.err
	default:
		return false, nil
	}
}
