package testenv

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestDescribeMachinesSaysWhatIsNotWell(t *testing.T) {
	now := metav1.Now()
	ms := []machinistv1.Machine{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "a"},
			Spec:       machinistv1.MachineSpec{Version: Version, ClassRef: machinistv1.ClassReference{Name: "small"}},
			Status: machinistv1.MachineStatus{Phase: machinistv1.MachineRunning, Conditions: []metav1.Condition{
				{Type: machinistv1.ConditionNodeHealthy, Status: metav1.ConditionTrue, Reason: "Healthy"},
			}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "b", DeletionTimestamp: &now},
			Spec:       machinistv1.MachineSpec{Version: Version, ClassRef: machinistv1.ClassReference{Name: "small"}},
			Status: machinistv1.MachineStatus{
				Phase:       machinistv1.MachineRebooting,
				Operation:   &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "reboot-1", State: machinistv1.OperationPending},
				Remediation: &machinistv1.MachineRemediation{HealthCheck: "hc", Phase: machinistv1.RemediationRecovered, Action: machinistv1.RemediateReboot},
				Conditions: []metav1.Condition{
					{Type: machinistv1.ConditionNodeHealthy, Status: metav1.ConditionFalse, Reason: "NodeUnknown", Message: "the Lease is 30s old"},
				},
			},
		},
	}
	got := strings.Split(DescribeMachines(ms), "\n")
	want := []string{
		"",
		"  a " + Version + " small Running",
		"  b " + Version + " small Rebooting (deleting) op Reboot reboot-1 Pending remediation Reboot Recovered " +
			machinistv1.ConditionNodeHealthy + "=False NodeUnknown: the Lease is 30s old;",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:%s\nwant:%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
