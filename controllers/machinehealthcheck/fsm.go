// Package machinehealthcheck is the MachineHealthCheck controller: it judges the
// Machines a health check selects and walks each unhealthy one up the
// check's remediation ladder (reboot, repair, replace), within the limits
// the check sets. Where a Machine stands on the ladder is one declared
// state machine, stored in the Machine's status.remediation.
package machinehealthcheck

import (
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/statemachine"
)

// Event is something that happened to a Machine's remediation.
type Event string

// The events of the remediation state machine.
const (
	// Detect: the Machine failed a check.
	Detect Event = "detect"
	// Reboot: a Reboot rung started.
	Reboot Event = "reboot"
	// Repair: a Repair rung started.
	Repair Event = "repair"
	// Replace: a Replace rung deleted the Machine.
	Replace Event = "replace"
	// Exhaust: no rung is left to try, and the Machine is still unhealthy.
	Exhaust Event = "exhaust"
	// Recover: the Machine passes its checks again after a rung.
	Recover Event = "recover"
	// Heal: the Machine passes its checks again before any rung started.
	Heal Event = "heal"
)

// rungs are where a rung can start from: a Machine just found unhealthy,
// or one whose rung in progress handed over.
var rungs = []machinistv1.RemediationPhase{
	machinistv1.RemediationUnhealthy, machinistv1.RemediationRebooting, machinistv1.RemediationRepairing,
}

// Table is the remediation state machine of one Machine.
var Table = statemachine.Table[machinistv1.RemediationPhase, Event]{
	Initial: machinistv1.RemediationHealthy,
	Rules: []statemachine.Rule[machinistv1.RemediationPhase, Event]{
		{Event: Detect, From: phases(machinistv1.RemediationHealthy, machinistv1.RemediationRecovered), To: machinistv1.RemediationUnhealthy},
		{Event: Reboot, From: rungs, To: machinistv1.RemediationRebooting},
		{Event: Repair, From: rungs, To: machinistv1.RemediationRepairing},
		{Event: Replace, From: rungs, To: machinistv1.RemediationReplacing},
		{Event: Exhaust, From: rungs, To: machinistv1.RemediationExhausted},
		{Event: Recover, From: phases(machinistv1.RemediationRebooting, machinistv1.RemediationRepairing,
			machinistv1.RemediationExhausted), To: machinistv1.RemediationRecovered},
		{Event: Heal, From: phases(machinistv1.RemediationUnhealthy), To: machinistv1.RemediationHealthy},
	},
}

// ladder is one Machine's remediation state machine, rebuilt from
// status.remediation.phase for every reconcile.
type ladder = statemachine.Machine[machinistv1.RemediationPhase, Event]

func newFSM(m *machinistv1.Machine) *ladder {
	if rem := m.Status.Remediation; rem != nil {
		return Table.New(rem.Phase)
	}
	return Table.New("")
}

func phases(p ...machinistv1.RemediationPhase) []machinistv1.RemediationPhase { return p }

// eventOf is the event that starts a rung of action a.
func eventOf(a machinistv1.RemediationAction) Event {
	switch a {
	case machinistv1.RemediateReboot:
		return Reboot
	case machinistv1.RemediateRepair:
		return Repair
	}
	return Replace
}

// Diagram renders the table as "mermaid" or "dot".
func Diagram(format string) (string, error) { return Table.Diagram(format) }
