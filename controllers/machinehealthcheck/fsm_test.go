package machinehealthcheck

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func parse(s string) intstr.IntOrString { return intstr.Parse(s) }

// moves are every move of the remediation table, listed by hand: a rule
// added, dropped or widened by mistake changes the table and fails here.
var moves = [][3]string{
	{"Healthy", "detect", "Unhealthy"},
	{"Recovered", "detect", "Unhealthy"},
	{"Unhealthy", "reboot", "Rebooting"},
	{"Rebooting", "reboot", "Rebooting"},
	{"Repairing", "reboot", "Rebooting"},
	{"Unhealthy", "repair", "Repairing"},
	{"Rebooting", "repair", "Repairing"},
	{"Repairing", "repair", "Repairing"},
	{"Unhealthy", "replace", "Replacing"},
	{"Rebooting", "replace", "Replacing"},
	{"Repairing", "replace", "Replacing"},
	{"Unhealthy", "exhaust", "Exhausted"},
	{"Rebooting", "exhaust", "Exhausted"},
	{"Repairing", "exhaust", "Exhausted"},
	{"Rebooting", "recover", "Recovered"},
	{"Repairing", "recover", "Recovered"},
	{"Exhausted", "recover", "Recovered"},
	{"Unhealthy", "heal", "Healthy"},
}

func TestTableHasExactlyTheseMoves(t *testing.T) {
	want := map[[3]string]bool{}
	for _, m := range moves {
		want[m] = true
	}
	for _, s := range Table.States() {
		for _, e := range Table.Events() {
			to, ok := Table.Allowed(s, e)
			key := [3]string{string(s), string(e), string(to)}
			if ok && !want[key] {
				t.Errorf("the table allows %v, which is not a listed move", key)
			}
			if ok {
				delete(want, key)
			}
		}
	}
	for m := range want {
		t.Errorf("the table does not allow %v", m)
	}
	if Table.Initial != machinistv1.RemediationHealthy {
		t.Errorf("initial phase %s", Table.Initial)
	}
	// Replacing is the end: the Machine is gone.
	for _, e := range Table.Events() {
		if _, ok := Table.Allowed(machinistv1.RemediationReplacing, e); ok {
			t.Errorf("%s leaves Replacing", e)
		}
	}
}

func TestEveryActionHasItsEvent(t *testing.T) {
	for a, e := range map[machinistv1.RemediationAction]Event{
		machinistv1.RemediateReboot: Reboot, machinistv1.RemediateRepair: Repair, machinistv1.RemediateReplace: Replace,
	} {
		if got := eventOf(a); got != e {
			t.Errorf("eventOf(%s) = %s, want %s", a, got, e)
		}
	}
}
