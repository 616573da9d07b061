package deployment

import (
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/statemachine"
)

// Event is something that happened to a rollout.
type Event string

// The events of the rollout state machine.
const (
	// Start: some Machines do not match the current template.
	Start Event = "start"
	// Complete: every Machine matches the current template and is available.
	Complete Event = "complete"
	// Pause: spec.paused was set.
	Pause Event = "pause"
	// Resume: spec.paused was cleared.
	Resume Event = "resume"
	// Stall: no progress within progressDeadlineSeconds.
	Stall Event = "stall"
	// Unstall: a stalled rollout made progress again.
	Unstall Event = "unstall"
)

// Rollout is the rollout state machine of a MachineDeployment.
var Rollout = statemachine.Table[machinistv1.RolloutPhase, Event]{
	Initial: machinistv1.RolloutStable,
	Rules: []statemachine.Rule[machinistv1.RolloutPhase, Event]{
		{Event: Start, From: []machinistv1.RolloutPhase{machinistv1.RolloutStable}, To: machinistv1.RolloutProgressing},
		{Event: Complete, From: []machinistv1.RolloutPhase{machinistv1.RolloutProgressing, machinistv1.RolloutStalled}, To: machinistv1.RolloutStable},
		{Event: Pause, From: []machinistv1.RolloutPhase{machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutStalled}, To: machinistv1.RolloutPaused},
		{Event: Resume, From: []machinistv1.RolloutPhase{machinistv1.RolloutPaused}, To: machinistv1.RolloutProgressing},
		{Event: Stall, From: []machinistv1.RolloutPhase{machinistv1.RolloutProgressing}, To: machinistv1.RolloutStalled},
		{Event: Unstall, From: []machinistv1.RolloutPhase{machinistv1.RolloutStalled}, To: machinistv1.RolloutProgressing},
	},
}
