package machine

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
)

// step is one reconcile of one Machine: the state machine rebuilt from
// status, what the phases' handlers need, the transitions fired so far,
// and when to look again.
type step struct {
	m     *machinistv1.Machine
	fsm   *phases.Machine
	now   time.Time
	class *machinistv1.MachineClass // nil when it does not exist
	nodes nodes.Cluster             // where the Machine's Node lives
	// down says why the Machine's cluster cannot be reached now; nil
	// when it can. Handlers then do nothing on the Node side.
	down *nodes.NotConnectedError
	// back is when the Machine's cluster was last found reachable again
	// (zero for the manager's own): deadlines that wait on its Node
	// count from no earlier, since the Node could not report before.
	back time.Time

	fired   []machinistv1.Transition
	entered []time.Time // when each fired transition's From phase was entered
	requeue time.Duration
	gone    bool
	// notes are Events about operations, emitted once the status that
	// holds them is stored.
	notes []note
	// ack is the ID of an operation requested by annotation whose
	// annotation is removed once the operation is stored.
	ack string
	// requested is the ID of an operation this step recorded (from the
	// annotation or a changed version), not stored yet.
	requested string
}

// fire moves the Machine by e and records the transition in status; an
// event the table does not allow is an error and changes nothing.
func (s *step) fire(e phases.Event) error {
	entered := s.enteredAt()
	from, to, err := s.fsm.Fire(e)
	if err != nil {
		return err
	}
	t := machinistv1.Transition{From: from, To: to, Event: string(e), Time: metav1.NewTime(s.now)}
	s.m.Status.Phase = to
	s.m.Status.LastTransition = &t
	s.m.Status.ErrorCount = 0
	s.fired = append(s.fired, t)
	s.entered = append(s.entered, entered)
	return nil
}

// outcome is what a phase's handler concluded: wait (no event), move by
// an event of the table and go on with the next phase's handler
// (advance), move and end the reconcile there (settle), or fail.
type outcome struct {
	event  phases.Event
	settle bool
	// reason says why the Machine waits, for the log.
	reason string
	err    error
}

// advance moves by e and hands the Machine to its new phase's handler in
// the same reconcile, so that what is already true (an instance created, a
// Node already Ready) costs no second write.
func advance(e phases.Event) outcome { return outcome{event: e} }

// settle moves by e and ends the reconcile: what comes next is judged on
// the next look, from a cache that holds what this reconcile wrote (the
// Node it uncordoned, say), not from one that does not yet.
func settle(e phases.Event) outcome { return outcome{event: e, settle: true} }

// fail ends the reconcile with err; whatever the handler changed in status
// before is still written, the move it did not make is not.
func fail(err error) outcome { return outcome{err: err} }

// phaseHandler is what the Machine controller does in one phase, and the moves
// it may make there: the table must allow each from that phase, which a
// test checks, and the driver refuses any other.
type phaseHandler struct {
	run   func(r *Reconciler, ctx context.Context, s *step) outcome
	moves []phases.Event
}

// handlers maps every phase to its handler.
type handlers map[machinistv1.MachinePhase]phaseHandler

// maxMoves bounds one reconcile's moves. The longest path the handlers
// take in one reconcile is five moves (Pending to Provisioning, Running,
// Draining, Rebooting and back to Running, for a machine that is there
// already); a loop past this is a bug, reported as an error, not spun
// forever.
const maxMoves = 6

// drive runs the handler of the Machine's phase, fires the event it asks
// for, and goes on with the new phase's handler while handlers advance.
func (r *Reconciler) drive(ctx context.Context, s *step, hs handlers) error {
	for range maxMoves {
		phase := s.fsm.State()
		h, ok := hs[phase]
		if !ok {
			return nil // Gone: nothing is left to handle.
		}
		o := h.run(r, ctx, s)
		if o.err != nil {
			return o.err
		}
		if o.event == "" {
			if l := log.FromContext(ctx).V(1); o.reason != "" && l.Enabled() {
				l.Info("waiting", "phase", phase, "reason", o.reason)
			}
			return nil
		}
		if !slices.Contains(h.moves, o.event) {
			return fmt.Errorf("%w: the %s handler fired %q, which it does not declare", phases.ErrNotAllowed, phase, o.event)
		}
		if err := s.fire(o.event); err != nil {
			return err
		}
		if o.settle {
			return nil
		}
	}
	return fmt.Errorf("more than %d moves in one reconcile, now %s", maxMoves, s.fsm.State())
}

func moves(e ...phases.Event) []phases.Event { return e }

// live are the handlers of a Machine that is not being deleted. A
// Machine is Deleting only while it is being deleted, so the live Deleting
// handler only waits: a phase written by hand does not destroy an
// instance.
var live = handlers{
	machinistv1.MachinePending:      {(*Reconciler).create, moves(phases.Provision, phases.Fail)},
	machinistv1.MachineProvisioning: {(*Reconciler).awaitNode, moves(phases.Provisioned, phases.Fail)},
	machinistv1.MachineRunning:      {(*Reconciler).serve, moves(phases.Drain, phases.Reboot, phases.Repair)},
	machinistv1.MachineDraining:     {(*Reconciler).drainFor, moves(phases.Reboot, phases.Repair, phases.Update, phases.Abort)},
	machinistv1.MachineRebooting:    {(*Reconciler).awaitBoot, moves(phases.Rebooted, phases.Fail)},
	machinistv1.MachineRepairing:    {(*Reconciler).awaitBoot, moves(phases.Repaired, phases.Fail)},
	machinistv1.MachineUpdating:     {(*Reconciler).awaitBoot, moves(phases.Updated, phases.Fail)},
	machinistv1.MachineFailed:       {(*Reconciler).repairFailed, moves(phases.Repair)},
	machinistv1.MachineDeleting:     {(*Reconciler).awaitDeletion, nil},
}

// deleting are the handlers of a Machine being deleted: a Running one is
// drained first, every other goes to Deleting at once, and Deleting
// destroys the instance and lets the Machine go.
var deleting = handlers{
	machinistv1.MachinePending:      {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineProvisioning: {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineRunning:      {(*Reconciler).drainBeforeDeleting, moves(phases.Drain)},
	machinistv1.MachineDraining:     {(*Reconciler).drainToDelete, moves(phases.Delete)},
	machinistv1.MachineRebooting:    {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineRepairing:    {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineUpdating:     {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineFailed:       {(*Reconciler).startDeleting, moves(phases.Delete)},
	machinistv1.MachineDeleting:     {(*Reconciler).destroy, moves(phases.Deleted)},
}
