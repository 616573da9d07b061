// Package kubecontrollermanager runs Kubernetes' own kube-controller-manager
// beside a kube-apiserver. It always runs what lets machines join as
// kubelets do (JoinControllers: CertificateSigningRequests approved,
// signed with the cluster's CA and cleaned up, expired bootstrap tokens
// deleted); asked to, it also runs the controllers a machine fleet relies
// on (FleetControllers): the garbage collector (owner references cascade
// deletions), the namespace controller (a deleted namespace empties), the
// node lifecycle controller (a Node whose kubelet stops renewing its
// Lease is marked Ready=Unknown) and the storage version migrator (a
// resource's stored objects rewritten at its storage version). `machinist run` and the tests use it, so
// that what Kubernetes does is done by Kubernetes, as in a cluster.
package kubecontrollermanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/internal/orphans"
)

// JoinControllers are the kube-controller-manager controllers every Start
// runs: a joining machine's CertificateSigningRequest is approved (when
// its requester may, as the bootstrap RBAC lets a token's holder) and
// signed, old requests are cleaned up, and a bootstrap token's Secret is
// deleted once the token has expired.
var JoinControllers = []string{
	"certificatesigningrequest-approving-controller",
	"certificatesigningrequest-signing-controller",
	"certificatesigningrequest-cleaner-controller",
	"token-cleaner-controller",
}

// FleetControllers run too with Options.Fleet.
var FleetControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"node-lifecycle-controller",
	// Carries out StorageVersionMigrations (package migration); it reads
	// through the garbage collector's informers, so it runs only beside it.
	"storage-version-migrator-controller",
}

// APIQPS is the rate each of its controllers may send requests at.
const APIQPS = 200

// Files Start keeps in Options.Dir.
const (
	KubeconfigFile = "kube-controller-manager.kubeconfig"
	LogFile        = "kube-controller-manager.log"
)

// Options configure Start.
type Options struct {
	// Binary is the kube-controller-manager executable.
	Binary string
	// Dir receives its kubeconfig (KubeconfigFile, made anew at each
	// start) and its log (LogFile, appended to): the terminal is for what
	// a person should read.
	Dir string
	// CA is the cluster's CA, the one kube-apiserver trusts for client
	// certificates (Joinable): kubelets' client certificates are signed
	// with it.
	CA *ClusterCA
	// Fleet runs FleetControllers beside JoinControllers.
	Fleet bool
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
	controllers := JoinControllers
	if o.Fleet {
		controllers = append(slices.Clone(controllers), FleetControllers...)
	}
	args := []string{
		"--kubeconfig=" + filepath.Join(o.Dir, KubeconfigFile),
		"--controllers=" + strings.Join(controllers, ","),
		// One host, one controller manager: nothing to elect.
		"--leader-elect=false",
		// Its controllers act with its own credentials; no service account
		// token controller runs to mint theirs.
		"--use-service-account-credentials=false",
		// Nothing scrapes or probes it here.
		"--secure-port=0",
		// Kubernetes' default, 20 QPS (burst 30) for each controller's
		// client, lets the CSR approver, which makes two requests for each
		// joining machine (a SubjectAccessReview and the approval),
		// approve about 10 machines a second: a scale-up of 1,000 took
		// 99 s, all of it waiting on approvals (docs/benchmarks.md). A
		// cluster that joins machines by the hundred needs the same.
		"--kube-api-qps=" + strconv.Itoa(APIQPS),
		"--kube-api-burst=" + strconv.Itoa(2*APIQPS),
	}
	if o.CA != nil {
		// Only kubelets' client certificates: the general
		// --cluster-signing-cert-file would also sign, for whoever gets a
		// CSR approved, any user kube-apiserver's CA vouches for.
		args = append(args,
			"--cluster-signing-kubelet-client-cert-file="+o.CA.CertFile(),
			"--cluster-signing-kubelet-client-key-file="+o.CA.KeyFile())
	}
	if o.NodeMonitorGracePeriod > 0 {
		args = append(args, "--node-monitor-grace-period="+o.NodeMonitorGracePeriod.String())
	}
	if o.NodeMonitorPeriod > 0 {
		args = append(args, "--node-monitor-period="+o.NodeMonitorPeriod.String())
	}
	return args
}

// Start runs kube-controller-manager against env's kube-apiserver until
// Stop, or until this process dies: a watchdog then kills it, so that it
// never outlives its parent. It gets a client certificate of its own, for
// user system:kube-controller-manager in group system:masters: it acts for
// the whole cluster, and no service account tokens are minted here for its
// controllers to act as themselves.
func Start(env *envtest.Environment, opts Options) (*Process, error) {
	if opts.Binary == "" || opts.Dir == "" || opts.CA == nil {
		return nil, errors.New("controllermanager: Options needs a Binary, a Dir and a CA")
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("controllermanager: %w (make controlplane builds it)", err)
	}
	user, err := env.AddUser(envtest.User{Name: "system:kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(opts.Dir, KubeconfigFile), kubeconfig, 0o600); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(opts.Dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(opts.Binary, opts.Args()...)
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
