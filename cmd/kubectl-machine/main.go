// Command kubectl-machine is a kubectl plugin for Machinist: with it on
// PATH, `kubectl machine` reboots and repairs Machines, shows a Machine's
// status and operation, manages MachineDeployment rollouts the way
// `kubectl rollout` manages Deployments, and prints a WorkloadCluster's
// kubeconfig.
//
// Exit codes, for scripts:
//
//	0  success
//	1  error: usage, connection or anything unexpected
//	2  the operation ended Failed, or the rollout failed (progress deadline exceeded)
//	3  refused by the server: forbidden (403), not found (404), conflict (409) or invalid (422);
//	   also a WorkloadCluster's kubeconfig key missing from its Secret
//	4  timed out waiting
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/machinist-dev/machinist/cmd/kubectl-machine/internal/plugin"
)

func main() {
	os.Exit(plugin.Main(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
