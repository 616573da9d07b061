package clusters

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A workload cluster's kubelet Leases are watched as the manager's own
// are: a killed machine's Machine shows its Lease expired soon after it
// expires, although nothing but the expiry changes then (its cluster's
// node lifecycle controller marked the Node Unknown seconds before).
func TestAKilledMachineOfAWorkloadClusterShowsItsLeaseExpired(t *testing.T) {
	t.Parallel()
	ns := env.NewNamespace(t, "expiry", testenv.Small)
	serve(t, ns)
	m := &runPool(t, ns, "expiry", blue, 1)[0]
	if err := ctrls.Provider.Crash(m.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	// The Lease was renewed at most RenewInterval before the crash, and is
	// judged a second after it expires.
	within := time.Duration(leases.DurationSeconds)*time.Second + 5*time.Second
	testenv.WaitForObject(t, env.Client, within, m.Name+" showing its Lease expired", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if c == nil || c.Reason != machinistv1.ReasonNodeLeaseExpired {
			return fmt.Errorf("NodeHealthy %+v", c)
		}
		return nil
	})
	t.Logf("%s showed its Lease expired %s after the crash", m.Name, time.Since(crashed).Round(100*time.Millisecond))
}
