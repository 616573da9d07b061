// Package kubescheduler runs Kubernetes' own kube-scheduler beside a
// kube-apiserver, with its default profile: a pod without a nodeName is
// bound to a Node that fits it (its requests within the Node's
// allocatable, its selectors, affinities and tolerations), or is marked
// PodScheduled=False, Unschedulable, when none does. `machinist run` and
// the tests that need it use it, so that pods land on Machines' Nodes as
// in a cluster, where a node agent then runs them as a kubelet would.
package kubescheduler

import (
	"errors"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/machinist-dev/machinist/dev/internal/component"
)

// Files Start keeps in Options.Dir.
const (
	KubeconfigFile = "kube-scheduler.kubeconfig"
	LogFile        = "kube-scheduler.log"
)

// Options configure Start.
type Options struct {
	// Binary is the kube-scheduler executable.
	Binary string
	// Dir receives its kubeconfig (KubeconfigFile, made anew at each
	// start) and its log (LogFile, appended to): the terminal is for what
	// a person should read.
	Dir string
}

// Process is a running kube-scheduler.
type Process = component.Process

// Args are the command-line arguments Start runs the binary with.
func (o Options) Args() []string {
	return []string{
		// Deprecated in favour of a KubeSchedulerConfiguration file
		// (--config), but it is all the configuration needed here, and it
		// tells the scheduler not to look for an in-cluster one.
		"--kubeconfig=" + filepath.Join(o.Dir, KubeconfigFile),
		// One host, one scheduler: nothing to elect.
		"--leader-elect=false",
		// Nothing scrapes or probes it here; and with nothing served, it
		// needs no authentication or authorization kubeconfig to check
		// who calls.
		"--secure-port=0",
	}
}

// Start runs kube-scheduler against env's kube-apiserver until Stop, or
// until this process dies: a watchdog then kills it, so that it never
// outlives its parent. It gets a client certificate of its own, for user
// system:kube-scheduler, the name kube-apiserver's bootstrap RBAC grants
// a scheduler's rights to, in group system:masters as
// kube-controller-manager is: it is part of this cluster's own control
// plane, and a right that policy lacks (for an API a feature gate turns
// on) would otherwise leave pods Pending, with why only in its log.
func Start(env *envtest.Environment, opts Options) (*Process, error) {
	if opts.Binary == "" || opts.Dir == "" {
		return nil, errors.New("kubescheduler: Options needs a Binary and a Dir")
	}
	return component.Start(env, component.Options{
		Binary:         opts.Binary,
		Args:           opts.Args(),
		User:           envtest.User{Name: "system:kube-scheduler", Groups: []string{"system:masters"}},
		KubeconfigFile: filepath.Join(opts.Dir, KubeconfigFile),
		LogFile:        filepath.Join(opts.Dir, LogFile),
	})
}
