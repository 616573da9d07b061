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
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/dev/internal/component"
)

// JoinControllers are the kube-controller-manager controllers every Start
// runs: a joining machine's CertificateSigningRequest is approved (when
// its requester may, as the bootstrap RBAC lets a token's holder) and
// signed, old requests are cleaned up, and a bootstrap token's Secret is
// deleted once the token has expired.
var JoinControllers = []string{
	ApproverController,
	"certificatesigningrequest-signing-controller",
	"certificatesigningrequest-cleaner-controller",
	TokenCleanerController,
}

// ApproverController approves the certificate requests of joining
// machines.
const ApproverController = "certificatesigningrequest-approving-controller"

// TokenCleanerController deletes the Secrets of expired bootstrap tokens.
const TokenCleanerController = "token-cleaner-controller"

// FleetControllers run too with Options.Fleet.
var FleetControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	NodeLifecycleController,
	// Carries out StorageVersionMigrations (package migration); it reads
	// through the garbage collector's informers, so it runs only beside it.
	"storage-version-migrator-controller",
}

// WorkloadControllers run too with Options.Workloads, for a cluster whose
// Nodes run pods (real nodes): those that make the pods of Deployments,
// ReplicaSets, StatefulSets, DaemonSets and Jobs, the one that keeps the
// status of PodDisruptionBudgets that evictions are judged by (without
// it, a budget refuses every eviction), and the one that deletes pods
// whose Node is gone.
var WorkloadControllers = []string{
	"deployment-controller",
	"replicaset-controller",
	"statefulset-controller",
	"daemonset-controller",
	"job-controller",
	"disruption-controller",
	"pod-garbage-collector-controller",
}

// NodeLifecycleController is the one of FleetControllers that
// Options.NodeLifecycle runs alone.
const NodeLifecycleController = "node-lifecycle-controller"

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
	// NodeLifecycle runs NodeLifecycleController beside JoinControllers
	// (Fleet runs it anyway), for a cluster with a scheduler:
	// kube-apiserver taints every new Node not-ready (its
	// TaintNodesByCondition admission), and no pod is scheduled onto it
	// until that controller lifts the taint, once the Node is Ready.
	NodeLifecycle bool
	// Workloads runs WorkloadControllers beside the others.
	Workloads bool
	// NodeMonitorGracePeriod is how long a Node's kubelet may go without
	// renewing its Lease or posting status before the Node is marked
	// Ready=Unknown; zero keeps Kubernetes' default (50s). NodeMonitorPeriod
	// is how often Nodes are looked at; zero keeps the default (5s).
	NodeMonitorGracePeriod, NodeMonitorPeriod time.Duration
	// Without are controllers left out, for a cluster that lacks them
	// (say, JoinControllers' approver, to see what a join then says).
	Without []string
}

// Process is a running kube-controller-manager.
type Process = component.Process

// Args are the command-line arguments Start runs the binary with.
func (o Options) Args() []string {
	controllers := JoinControllers
	switch {
	case o.Fleet:
		controllers = append(slices.Clone(controllers), FleetControllers...)
	case o.NodeLifecycle:
		controllers = append(slices.Clone(controllers), NodeLifecycleController)
	}
	if o.Workloads {
		controllers = append(slices.Clone(controllers), WorkloadControllers...)
	}
	controllers = slices.DeleteFunc(slices.Clone(controllers), func(c string) bool { return slices.Contains(o.Without, c) })
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
	return component.Start(env, component.Options{
		Binary:         opts.Binary,
		Args:           opts.Args(),
		User:           envtest.User{Name: "system:kube-controller-manager", Groups: []string{"system:masters"}},
		KubeconfigFile: filepath.Join(opts.Dir, KubeconfigFile),
		LogFile:        filepath.Join(opts.Dir, LogFile),
	})
}
