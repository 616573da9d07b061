package inmemory_test

import (
	"testing"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// The provider knows no cluster: its Machine's Node lives in a workload
// cluster it holds no credentials for, and a repair still registers it
// afresh, by the machine with the repair's token.
func TestRepairRegistersAfreshInAWorkloadCluster(t *testing.T) {
	m, class := machine(t, "workload", "m", "")
	testenv.CheckRepairRegistersAfresh(t, clientset, newProvider(t), m, class, wait)
}
