// Package phases drives every Machine through one declared state
// machine. The table below is the only place phases and their transitions
// are defined; the Machine controller (controllers/machine) is the only code that
// moves a Machine from one phase to another, and only by firing an event
// the table allows.
package phases

import (
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/statemachine"
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
	// Repair: the provider is re-imaging the instance. A Failed Machine
	// that has an instance can be repaired without a drain: re-imaging is
	// what brings such a machine back. A Running one is, when the
	// request asked for no drain.
	Repair Event = "repair"
	// Repaired: the re-imaged Node is Ready with a new boot ID.
	Repaired Event = "repaired"
	// Update: the provider is changing the instance in place to the
	// Machine's spec.version.
	Update Event = "update"
	// Updated: the Node reports the new version, a new boot ID and Ready.
	Updated Event = "updated"
	// Delete: the instance is being destroyed.
	Delete Event = "delete"
	// Deleted: the instance and its Node are gone; the Machine object goes next.
	Deleted Event = "deleted"
	// Fail: the Machine cannot make progress without a person.
	Fail Event = "fail"
	// Abort: the operation that drained the Machine was given up before
	// the provider was called; the Machine returns to service.
	Abort Event = "abort"
)

// Gone is the state after the last transition, named Deleted. It lives only
// in the table, Events and metrics: by then no Machine object is left to
// hold it in status.
const Gone machinistv1.MachinePhase = "Deleted"

// Table is the Machine state machine.
var Table = statemachine.Table[machinistv1.MachinePhase, Event]{
	Initial: machinistv1.MachinePending,
	Rules: []statemachine.Rule[machinistv1.MachinePhase, Event]{
		{Event: Provision, From: phases(machinistv1.MachinePending), To: machinistv1.MachineProvisioning},
		{Event: Provisioned, From: phases(machinistv1.MachineProvisioning), To: machinistv1.MachineRunning},
		{Event: Drain, From: phases(machinistv1.MachineRunning), To: machinistv1.MachineDraining},
		{Event: Reboot, From: phases(machinistv1.MachineRunning, machinistv1.MachineDraining), To: machinistv1.MachineRebooting},
		{Event: Rebooted, From: phases(machinistv1.MachineRebooting), To: machinistv1.MachineRunning},
		{Event: Repair, From: phases(machinistv1.MachineRunning, machinistv1.MachineDraining, machinistv1.MachineFailed), To: machinistv1.MachineRepairing},
		{Event: Repaired, From: phases(machinistv1.MachineRepairing), To: machinistv1.MachineRunning},
		{Event: Update, From: phases(machinistv1.MachineDraining), To: machinistv1.MachineUpdating},
		{Event: Updated, From: phases(machinistv1.MachineUpdating), To: machinistv1.MachineRunning},
		{Event: Delete, From: phases(machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineDraining,
			machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineUpdating, machinistv1.MachineFailed), To: machinistv1.MachineDeleting},
		{Event: Deleted, From: phases(machinistv1.MachineDeleting), To: Gone},
		{Event: Abort, From: phases(machinistv1.MachineDraining), To: machinistv1.MachineRunning},
		{Event: Fail, From: phases(machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRebooting,
			machinistv1.MachineRepairing, machinistv1.MachineUpdating), To: machinistv1.MachineFailed},
	},
}

func phases(p ...machinistv1.MachinePhase) []machinistv1.MachinePhase { return p }

// Initial is the phase of a Machine the controller has not yet acted on.
// An empty status.phase means Initial.
var Initial = Table.Initial

// Machine is the state machine of one Machine, rebuilt from status.phase for
// every reconcile: the phase in the API is the truth.
type Machine = statemachine.Machine[machinistv1.MachinePhase, Event]

// ErrNotAllowed is returned, wrapped, for an event the table does not allow
// in the current phase.
var ErrNotAllowed = statemachine.ErrNotAllowed

// New returns the state machine standing in phase; "" means Initial.
func New(phase machinistv1.MachinePhase) *Machine { return Table.New(phase) }

// States lists every state of the table, Initial first.
func States() []machinistv1.MachinePhase { return Table.States() }

// Events lists every event of the table in table order.
func Events() []Event { return Table.Events() }

// Diagram renders the table as "mermaid" or "dot".
func Diagram(format string) (string, error) { return Table.Diagram(format) }
