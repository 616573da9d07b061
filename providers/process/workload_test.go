package process_test

import (
	"testing"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// The provider knows no cluster: its machine's Node lives in a workload
// cluster it holds no credentials for, and a repair still registers it
// afresh, by the machine's agent with the repair's token.
func TestRepairRegistersAfreshInAWorkloadCluster(t *testing.T) {
	p, _ := newProvider(t, "")
	testenv.CheckRepairRegistersAfresh(t, clientset, p, machine("workload"), nil, wait)
}
