package machine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

var handlerSets = map[string]handlers{"live": live, "deleting": deleting}

// TestEveryPhaseHasAHandler: a phase the table declares but no handler
// serves would leave a Machine there for good, in silence.
func TestEveryPhaseHasAHandler(t *testing.T) {
	for name, hs := range handlerSets {
		for _, p := range phases.States() {
			if p == phases.Gone {
				if _, ok := hs[p]; ok {
					t.Errorf("%s: Gone has a handler, but no Machine is left to hold it", name)
				}
				continue
			}
			if h, ok := hs[p]; !ok || h.run == nil {
				t.Errorf("%s: phase %s has no handler", name, p)
			}
		}
		for p := range hs {
			if !slices.Contains(phases.States(), p) {
				t.Errorf("%s: a handler for %q, which the table does not declare", name, p)
			}
		}
	}
}

// TestNoHandlerDeclaresAMoveTheTableLacks: what a handler may fire is
// declared beside it, and the driver fires nothing else; each such move
// must be one the table allows from the handler's phase.
func TestNoHandlerDeclaresAMoveTheTableLacks(t *testing.T) {
	for name, hs := range handlerSets {
		for p, h := range hs {
			for _, e := range h.moves {
				if _, ok := phases.Table.Allowed(p, e); !ok {
					t.Errorf("%s: the %s handler declares %q, which the table does not allow there", name, p, e)
				}
			}
		}
	}
	// Every move of the table out of a phase a Machine holds is made by
	// some handler; one made by none is a move the controller lost.
	made := map[machinistv1.MachinePhase][]phases.Event{}
	for _, hs := range handlerSets {
		for p, h := range hs {
			made[p] = append(made[p], h.moves...)
		}
	}
	for _, r := range phases.Table.Rules {
		for _, from := range r.From {
			if !slices.Contains(made[from], r.Event) {
				t.Errorf("no handler makes the move %s --%s--> %s", from, r.Event, r.To)
			}
		}
	}
}

func testStep(phase machinistv1.MachinePhase) *step {
	m := &machinistv1.Machine{}
	m.Status.Phase = phase
	return &step{m: m, fsm: phases.New(phase), now: time.Now()}
}

// TestTheDriverFiresOnlyDeclaredMoves: a handler that asks for a move it
// did not declare is refused, even one the table allows, and nothing
// moves.
func TestTheDriverFiresOnlyDeclaredMoves(t *testing.T) {
	hs := handlers{machinistv1.MachinePending: {
		run:   func(*Reconciler, context.Context, *step) outcome { return advance(phases.Delete) },
		moves: moves(phases.Provision),
	}}
	s := testStep(machinistv1.MachinePending)
	err := (&Reconciler{}).drive(context.Background(), s, hs)
	if !errors.Is(err, phases.ErrNotAllowed) {
		t.Fatalf("drive: %v, want an error wrapping ErrNotAllowed", err)
	}
	if s.m.Status.Phase != machinistv1.MachinePending || len(s.fired) != 0 {
		t.Errorf("moved to %s (%d fired), want to stay Pending", s.m.Status.Phase, len(s.fired))
	}
}

// TestTheDriverGoesOnWhileHandlersAdvance: advance hands the Machine to
// the next phase's handler in the same reconcile, settle and wait end it,
// and a failure stops it with the error.
func TestTheDriverGoesOnWhileHandlersAdvance(t *testing.T) {
	var ran []machinistv1.MachinePhase
	run := func(o outcome) func(*Reconciler, context.Context, *step) outcome {
		return func(_ *Reconciler, _ context.Context, s *step) outcome {
			ran = append(ran, s.fsm.State())
			return o
		}
	}
	boom := errors.New("boom")
	hs := handlers{
		machinistv1.MachinePending:      {run(advance(phases.Provision)), moves(phases.Provision)},
		machinistv1.MachineProvisioning: {run(advance(phases.Provisioned)), moves(phases.Provisioned)},
		machinistv1.MachineRunning:      {run(settle(phases.Reboot)), moves(phases.Reboot)},
		machinistv1.MachineRebooting:    {run(fail(boom)), nil},
	}
	s := testStep(machinistv1.MachinePending)
	if err := (&Reconciler{}).drive(context.Background(), s, hs); err != nil {
		t.Fatal(err)
	}
	want := []machinistv1.MachinePhase{machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning}
	if !slices.Equal(ran, want) || s.m.Status.Phase != machinistv1.MachineRebooting || len(s.fired) != 3 {
		t.Errorf("ran %v and stopped in %s after %d moves; want %v, Rebooting, 3", ran, s.m.Status.Phase, len(s.fired), want)
	}
	ran = nil
	if err := (&Reconciler{}).drive(context.Background(), s, hs); !errors.Is(err, boom) {
		t.Errorf("drive: %v, want the handler's error", err)
	}
	if s.m.Status.Phase != machinistv1.MachineRebooting {
		t.Errorf("a failed handler moved the Machine to %s", s.m.Status.Phase)
	}
}

// TestTheDriverStopsALoop: handlers that keep advancing in a circle are a
// bug, reported, not spun forever.
func TestTheDriverStopsALoop(t *testing.T) {
	hs := handlers{
		machinistv1.MachineRunning:  {func(*Reconciler, context.Context, *step) outcome { return advance(phases.Drain) }, moves(phases.Drain)},
		machinistv1.MachineDraining: {func(*Reconciler, context.Context, *step) outcome { return advance(phases.Abort) }, moves(phases.Abort)},
	}
	s := testStep(machinistv1.MachineRunning)
	if err := (&Reconciler{}).drive(context.Background(), s, hs); err == nil {
		t.Fatalf("a loop of moves ended without an error after %d moves", len(s.fired))
	}
	if len(s.fired) != maxMoves {
		t.Errorf("%d moves before stopping, want %d", len(s.fired), maxMoves)
	}
}
