package machinedeployment

import (
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/statemachine"
)

// Event is something that happened to a rollout.
type Event string

// The events of the rollout state machine.
const (
	// Start: some Machines do not match the current template.
	Start Event = "start"
	// Complete: every Machine matches the current template and is
	// available, and the rollout is not paused.
	Complete Event = "complete"
	// Pause: spec.paused was set.
	Pause Event = "pause"
	// Resume: spec.paused was cleared and Machines are left to replace.
	Resume Event = "resume"
	// Stall: no progress within progressDeadlineSeconds.
	Stall Event = "stall"
	// Unstall: a stalled rollout made progress again.
	Unstall Event = "unstall"
)

// Rollout is the rollout state machine of a MachineDeployment.
//
// Complete leads from Paused to Stable as well: a rollout resumed with
// nothing left to replace never progresses, so resuming it through
// Progressing would report a phase it never held.
var Rollout = statemachine.Table[machinistv1.RolloutPhase, Event]{
	Initial: machinistv1.RolloutStable,
	Rules: []statemachine.Rule[machinistv1.RolloutPhase, Event]{
		{Event: Start, From: []machinistv1.RolloutPhase{machinistv1.RolloutStable}, To: machinistv1.RolloutProgressing},
		{Event: Complete, From: []machinistv1.RolloutPhase{machinistv1.RolloutProgressing, machinistv1.RolloutStalled, machinistv1.RolloutPaused}, To: machinistv1.RolloutStable},
		{Event: Pause, From: []machinistv1.RolloutPhase{machinistv1.RolloutStable, machinistv1.RolloutProgressing, machinistv1.RolloutStalled}, To: machinistv1.RolloutPaused},
		{Event: Resume, From: []machinistv1.RolloutPhase{machinistv1.RolloutPaused}, To: machinistv1.RolloutProgressing},
		{Event: Stall, From: []machinistv1.RolloutPhase{machinistv1.RolloutProgressing}, To: machinistv1.RolloutStalled},
		{Event: Unstall, From: []machinistv1.RolloutPhase{machinistv1.RolloutStalled}, To: machinistv1.RolloutProgressing},
	},
}

// Facts are what one reconcile observes of a rollout; they, and the phase
// it stands in, decide its moves.
type Facts struct {
	// Paused: spec.paused is set.
	Paused bool
	// Complete: the current template's set has spec.replicas available
	// Machines and no other Machine is left.
	Complete bool
	// DeadlinePassed: no progress for progressDeadlineSeconds.
	DeadlinePassed bool
}

// Decide returns the events that move a rollout standing in phase as the
// facts say, in the order they are to be fired; none when it stays. Each
// is chosen by the phase the one before it led to, and only when its own
// condition holds there, so every phase on the way is one the rollout
// really holds: an incomplete rollout found past its deadline in Stable
// starts and then stalls, but a resumed one with nothing to replace goes
// straight to Stable. The table says where each event leads; an event it
// does not allow ends the list, and firing it reports the error.
func Decide(phase machinistv1.RolloutPhase, f Facts) []Event {
	if phase == "" {
		phase = Rollout.Initial
	}
	var events []Event
	// Each move leaves a phase the facts no longer move it back to, so
	// the list is never longer than the table; the bound only guards
	// against a decision that would loop.
	for e := next(phase, f); e != "" && len(events) < len(Rollout.Rules); e = next(phase, f) {
		events = append(events, e)
		to, ok := Rollout.Allowed(phase, e)
		if !ok {
			break
		}
		phase = to
	}
	return events
}

// next is the one event the facts justify in phase, or "" when they hold
// it there. One case per phase; spec.paused overrides every other fact,
// and a complete rollout is never reported stalled.
func next(phase machinistv1.RolloutPhase, f Facts) Event {
	if f.Paused {
		if phase == machinistv1.RolloutPaused {
			return ""
		}
		return Pause
	}
	switch phase {
	case machinistv1.RolloutStable:
		if !f.Complete {
			return Start
		}
	case machinistv1.RolloutProgressing:
		switch {
		case f.Complete:
			return Complete
		case f.DeadlinePassed:
			return Stall
		}
	case machinistv1.RolloutStalled:
		switch {
		case f.Complete:
			return Complete
		case !f.DeadlinePassed:
			return Unstall
		}
	case machinistv1.RolloutPaused:
		if f.Complete {
			return Complete
		}
		return Resume
	}
	return ""
}
