// Package lifecycle drives every Machine through one declared state
// machine. The table below is the only place phases and their transitions
// are defined; the Machine controller in this package is the only code that
// moves a Machine from one phase to another, and only by firing an event
// the table allows.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/looplab/fsm"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// Event is a name for something that happened to a Machine.
type Event string

// The events of the Machine state machine.
const (
	// Provision: the provider accepted the request to create the instance.
	Provision Event = "provision"
	// Provisioned: the instance's Node registered and became Ready.
	Provisioned Event = "provisioned"
	// Drain: the Machine must be emptied of pods before what comes next.
	Drain Event = "drain"
	// Reboot: the provider is restarting the instance.
	Reboot Event = "reboot"
	// Rebooted: the Node came back with a new boot ID and Ready.
	Rebooted Event = "rebooted"
	// Repair: the provider is re-imaging the instance.
	Repair Event = "repair"
	// Repaired: the re-imaged Node is Ready with a new boot ID.
	Repaired Event = "repaired"
	// Delete: the instance is being destroyed.
	Delete Event = "delete"
	// Deleted: the instance and its Node are gone; the Machine object goes next.
	Deleted Event = "deleted"
	// Fail: the Machine cannot make progress without a person.
	Fail Event = "fail"
)

// Gone is the state after the last transition, named Deleted. It lives only
// in the table, Events and metrics: by then no Machine object is left to
// hold it in status.
const Gone machinistv1.MachinePhase = "Deleted"

// Rule is one row of the table: Event moves a Machine from any of From to To.
type Rule struct {
	Event Event
	From  []machinistv1.MachinePhase
	To    machinistv1.MachinePhase
}

// Table is the Machine state machine.
var Table = []Rule{
	{Provision, phases(machinistv1.MachinePending), machinistv1.MachineProvisioning},
	{Provisioned, phases(machinistv1.MachineProvisioning), machinistv1.MachineRunning},
	{Drain, phases(machinistv1.MachineRunning), machinistv1.MachineDraining},
	{Reboot, phases(machinistv1.MachineRunning, machinistv1.MachineDraining), machinistv1.MachineRebooting},
	{Rebooted, phases(machinistv1.MachineRebooting), machinistv1.MachineRunning},
	{Repair, phases(machinistv1.MachineDraining), machinistv1.MachineRepairing},
	{Repaired, phases(machinistv1.MachineRepairing), machinistv1.MachineRunning},
	{Delete, phases(machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineDraining,
		machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineFailed), machinistv1.MachineDeleting},
	{Deleted, phases(machinistv1.MachineDeleting), Gone},
	{Fail, phases(machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRebooting,
		machinistv1.MachineRepairing), machinistv1.MachineFailed},
}

func phases(p ...machinistv1.MachinePhase) []machinistv1.MachinePhase { return p }

// Initial is the phase of a Machine the controller has not yet acted on.
// An empty status.phase means Initial.
const Initial = machinistv1.MachinePending

// States lists every state of the table, Initial first, then in the order
// the table first mentions them.
func States() []machinistv1.MachinePhase {
	states := []machinistv1.MachinePhase{Initial}
	add := func(p machinistv1.MachinePhase) {
		if !slices.Contains(states, p) {
			states = append(states, p)
		}
	}
	for _, r := range Table {
		for _, f := range r.From {
			add(f)
		}
		add(r.To)
	}
	return states
}

// Events lists every event of the table in table order.
func Events() []Event {
	var events []Event
	for _, r := range Table {
		if !slices.Contains(events, r.Event) {
			events = append(events, r.Event)
		}
	}
	return events
}

// ErrNotAllowed is returned, wrapped, for an event the table does not allow
// in the current phase.
var ErrNotAllowed = errors.New("event not allowed")

// Machine is the state machine of one Machine, rebuilt from status.phase for
// every reconcile: looplab/fsm keeps no state across processes, and the
// phase in the API is the truth.
type Machine struct {
	fsm *fsm.FSM
}

// New returns the state machine standing in phase; "" means Initial.
func New(phase machinistv1.MachinePhase) *Machine {
	if phase == "" {
		phase = Initial
	}
	return &Machine{fsm: fsm.NewFSM(string(phase), descriptions(), nil)}
}

func descriptions() fsm.Events {
	events := make(fsm.Events, 0, len(Table))
	for _, r := range Table {
		src := make([]string, len(r.From))
		for i, f := range r.From {
			src[i] = string(f)
		}
		events = append(events, fsm.EventDesc{Name: string(r.Event), Src: src, Dst: string(r.To)})
	}
	return events
}

// Phase is the current state.
func (m *Machine) Phase() machinistv1.MachinePhase {
	return machinistv1.MachinePhase(m.fsm.Current())
}

// Can reports whether the table allows e now.
func (m *Machine) Can(e Event) bool { return m.fsm.Can(string(e)) }

// Fire moves the state machine by e, or returns an error wrapping
// ErrNotAllowed and changes nothing.
func (m *Machine) Fire(e Event) (from, to machinistv1.MachinePhase, err error) {
	from = m.Phase()
	if err := m.fsm.Event(context.Background(), string(e)); err != nil {
		return from, from, fmt.Errorf("%w: %q in phase %s: %v", ErrNotAllowed, e, from, err)
	}
	return from, m.Phase(), nil
}

// Diagram renders the table as "mermaid" (a state diagram) or "dot"
// (Graphviz), starting from Initial.
func Diagram(format string) (string, error) {
	f := New(Initial).fsm
	switch format {
	case "mermaid":
		return fsm.VisualizeWithType(f, fsm.MermaidStateDiagram)
	case "dot":
		return fsm.VisualizeWithType(f, fsm.GRAPHVIZ)
	default:
		return "", fmt.Errorf("unknown format %q: use mermaid or dot", format)
	}
}
